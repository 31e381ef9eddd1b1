"""A few real DeepSpeed steps (CPU, gloo, fp32) on a tiny random policy."""

from __future__ import annotations

import pytest
import torch

from pipeline.training.batch import TokenizedSample, micro_batches
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine

VOCAB = 64


def samples(rewards: list[float], teacher: bool = False) -> list[TokenizedSample]:
    out = []
    for i, r in enumerate(rewards):
        prompt = [(i * 7 + j) % VOCAB for j in range(5 + i)]
        response = [(i * 3 + j) % VOCAB for j in range(2 + i % 3)]
        out.append(
            TokenizedSample(
                f"s:{i}", prompt, response, r, None, [-1.0] * len(response) if teacher else None, 0
            )
        )
    return out


def engine(mode: str, **kw) -> PolicyEngine:  # type: ignore[no-untyped-def]
    options = {
        "lr": 1e-2,
        "micro_batch_size": 2,
        "zero_stage": 1,
        "tiny_model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
    }
    config = TrainerConfig(mode=mode, **{**options, **kw})  # type: ignore[arg-type]
    return PolicyEngine(config, vocab_size=VOCAB)


def changed(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_rl_steps_change_parameters_and_first_loss_is_minus_mean_reward() -> None:
    eng = engine("rl")
    batch = samples([1.0, -1.0, 1.0, 0.5])
    mbs = micro_batches(batch, 2, pad_id=0)
    before = eng.parameters_snapshot()
    first = eng.train_step(mbs)
    # On-policy first step: ratio 1, so pg_loss = -sum(r_i * R_i) / sum(R_i).
    lengths = [len(s.response_ids) for s in batch]
    expected = -sum(s.reward * n for s, n in zip(batch, lengths, strict=True)) / sum(lengths)
    assert first.pg_loss == pytest.approx(expected, abs=1e-5)
    assert first.tokens == sum(lengths) and first.ppo_kl == pytest.approx(0.0, abs=1e-6)
    assert first.pg_clipfrac == 0.0 and first.train_rollout_logprob_abs_diff is None
    start = [eng.logprobs(mb) for mb in mbs]
    for _ in range(2):
        later = eng.train_step(mbs)
    assert changed(before, eng.parameters_snapshot())
    assert later.step == 3
    # The policy moved toward rewarded responses and away from penalised ones.
    end = [eng.logprobs(mb) for mb in mbs]
    for mb, s0, s1 in zip(mbs, start, end, strict=True):
        gain = ((s1 - s0) * mb.response_mask).sum(-1)
        for reward, g in zip(mb.rewards.tolist(), gain.tolist(), strict=True):
            assert (g > 0) == (reward > 0), (reward, g)


def test_combine_with_rollout_logprobs_matches_hand_value() -> None:
    eng = engine("combine", w_opd=2.0, w_rl=0.5)
    batch = samples([1.0, -1.0])
    [mb] = micro_batches(batch, 2, pad_id=0)
    current = eng.logprobs(mb)
    # Rollout log-probs equal to the trainer's: ratio 1, IS weight 1, no mismatch.
    mb.rollout_logprobs = current * mb.response_mask
    mb.has_rollout = torch.tensor([True, True])
    mb.teacher_logprobs = (current - 0.25) * mb.response_mask  # teacher - old = -0.25
    mb.has_teacher = torch.tensor([True, True])
    before = eng.parameters_snapshot()
    stats = eng.train_step([mb])
    n = [len(s.response_ids) for s in batch]
    adv = [2.0 * -0.25 + 0.5 * s.reward for s in batch]
    expected = -sum(a * k for a, k in zip(adv, n, strict=True)) / sum(n)
    assert stats.pg_loss == pytest.approx(expected, abs=1e-5)
    assert stats.train_rollout_logprob_abs_diff == pytest.approx(0.0, abs=1e-5)
    assert changed(before, eng.parameters_snapshot())


def test_opd_moves_the_policy_toward_the_teacher() -> None:
    eng = engine("opd", kl_coef=0.1, entropy_coef=0.01)
    mbs = micro_batches(samples([0.0, 0.0, 0.0], teacher=True), 2, pad_id=0)
    before = eng.parameters_snapshot()
    stats = eng.train_step(mbs)
    assert changed(before, eng.parameters_snapshot())
    assert stats.kl == pytest.approx(0.0, abs=1e-6)  # reference = policy before the step
    assert stats.entropy > 0
    assert eng.train_step(mbs).kl > 0


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_zero_stages_train_on_cpu(stage: int) -> None:
    eng = engine("rl", zero_stage=stage, update_weights_interval=0)
    mbs = micro_batches(samples([1.0, -1.0, 1.0]), 2, pad_id=0)
    start = [eng.logprobs(mb) for mb in mbs]
    stats = eng.train_step(mbs)
    assert stats.step == 1 and stats.tokens == sum(mb.tokens for mb in mbs)
    end = [eng.logprobs(mb) for mb in mbs]
    assert any(not torch.allclose(a, b) for a, b in zip(start, end, strict=True))


@pytest.mark.parametrize(
    "options",
    [
        {"gradient_checkpointing": True},
        {"bf16": True},
        {"zero_stage": 2, "offload_optimizer": True},
    ],
    ids=["gradient_checkpointing", "bf16", "zero2_offload"],
)
def test_memory_and_precision_options_train(options: dict) -> None:
    eng = engine("rl", **options)
    mbs = micro_batches(samples([1.0, -1.0]), 2, pad_id=0)
    before = eng.parameters_snapshot()
    stats = eng.train_step(mbs)
    assert stats.step == 1 and changed(before, eng.parameters_snapshot())
