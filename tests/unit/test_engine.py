"""A few real DeepSpeed steps (CPU, gloo, fp32) on a tiny random policy."""

from __future__ import annotations

import dataclasses
import itertools
import math

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


# old - rollout of successive response tokens: mismatch 0, 0.1, -0.3, 0.3 and a weight
# truncated at tis_clip (e^1.3 = 3.67 > 2).
MISMATCH = [0.0, 0.1, -0.3, 0.3, 1.3]


def with_rollout(eng: PolicyEngine, mbs: list) -> list[list[float | None]]:  # type: ignore[type-arg]
    """Give each micro-batch rollout log-probs that differ from the trainer's by MISMATCH.

    The last response token of every other sample has none (NaN), as when the
    serving engine reported no log-prob for the end-of-turn token. Returns the
    per-sample mismatches, None where missing.
    """
    per_sample, cycle = [], 0
    for mb in mbs:
        old = eng.logprobs(mb)
        rollout = torch.full_like(old, math.nan)
        for b in range(old.shape[0]):
            positions = mb.response_mask[b].nonzero().flatten().tolist()
            gaps: list[float | None] = []
            for _ in positions:
                gaps.append(MISMATCH[cycle % len(MISMATCH)])
                cycle += 1
            if b % 2:
                gaps[-1] = None
            for pos, gap in zip(positions, gaps, strict=True):
                if gap is not None:
                    rollout[b, pos] = old[b, pos] - gap
            per_sample.append(gaps)
        mb.rollout_logprobs = rollout
    return per_sample


def first_step_loss(
    advantages: list[list[float]], gaps: list[list[float | None]], agg: str
) -> float:
    """agg of -w * A at the first step (r = 1), w = min(e^(old - rollout), 2), by hand."""
    per_token = [
        [
            -(min(math.exp(g), 2.0) if g is not None else 1.0) * a
            for a, g in zip(adv, gs, strict=True)
        ]
        for adv, gs in zip(advantages, gaps, strict=True)
    ]
    if agg == "token_mean":
        return sum(map(sum, per_token)) / sum(map(len, per_token))
    return sum(sum(t) / len(t) for t in per_token) / len(per_token)


@pytest.mark.parametrize("agg", ["seq_mean_token_mean", "token_mean"])
def test_rl_first_step_loss_with_mismatched_rollout_logprobs(agg: str) -> None:
    eng = engine("rl", loss_agg=agg)
    mbs = micro_batches(samples([1.0, -1.0, 1.0, 0.5]), 2, pad_id=0)
    gaps = with_rollout(eng, mbs)
    rewards = [r for mb in mbs for r in mb.rewards.tolist()]
    advantages = [[r] * len(g) for r, g in zip(rewards, gaps, strict=True)]
    before = eng.parameters_snapshot()
    first = eng.train_step(mbs)
    assert first.pg_loss == pytest.approx(first_step_loss(advantages, gaps, agg), abs=1e-5)
    assert first.ppo_kl == pytest.approx(0.0, abs=1e-6) and first.pg_clipfrac == 0.0
    n = sum(map(len, gaps))
    assert first.tokens == n and first.tis_clipfrac > 0  # the 1.3 mismatches
    if agg == "token_mean":
        assert first.tis_clipfrac == pytest.approx(
            sum(g == 1.3 for gs in gaps for g in gs) / n, abs=1e-6
        )
    known = [g for gs in gaps for g in gs if g is not None]
    assert first.train_rollout_logprob_abs_diff == pytest.approx(
        sum(map(abs, known)) / len(known), rel=0.2
    )  # a mean over micro-batches of per-micro-batch means: close, not equal
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


def test_combine_first_step_matches_hand_value() -> None:
    eng = engine("combine", w_opd=2.0, w_rl=0.5)
    batch = samples([1.0, -1.0])
    [mb] = micro_batches(batch, 2, pad_id=0)
    gaps = with_rollout(eng, [mb])
    old = eng.logprobs(mb)
    mb.teacher_logprobs = (old - 0.25) * mb.response_mask  # teacher - old = -0.25
    mb.has_teacher = torch.tensor([True, False])  # the second sample has no teacher signal
    before = eng.parameters_snapshot()
    stats = eng.train_step([mb])
    rewards = mb.rewards.tolist()
    advantages = [
        [2.0 * -0.25 + 0.5 * rewards[0]] * len(gaps[0]),
        [0.5 * rewards[1]] * len(gaps[1]),
    ]
    assert stats.pg_loss == pytest.approx(
        first_step_loss(advantages, gaps, "seq_mean_token_mean"), abs=1e-5
    )
    assert changed(before, eng.parameters_snapshot())


def test_topk_distillation_adds_its_weighted_reverse_kl() -> None:
    eng = engine("opd", topk_distill_coef=0.5)
    [mb] = micro_batches(samples([0.0, 0.0], teacher=True), 2, pad_id=0)
    k = 3
    ids = torch.zeros(*mb.response_mask.shape, k, dtype=torch.long)
    teacher = torch.zeros(*mb.response_mask.shape, k)
    for b, t in mb.response_mask.nonzero().tolist():
        ids[b, t] = torch.tensor([(b + t) % VOCAB, (b + t + 7) % VOCAB, (b + t + 20) % VOCAB])
        teacher[b, t] = torch.log(torch.tensor([0.5, 0.2, 0.1]))
    mb.teacher_topk_ids, mb.teacher_topk_logprobs = ids, teacher
    mb.has_teacher_topk = torch.tensor([True, False])
    with torch.no_grad():
        logits = eng.engine(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        probs = torch.softmax(logits[:, :-1].double(), -1)
    positions = [(0, t) for t in mb.response_mask[0].nonzero().flatten().tolist()]
    per_token = []
    for b, t in positions:  # reverse KL over the 3 ids and the tail, from the probabilities
        p = [float(probs[b, t, i]) for i in ids[b, t].tolist()]
        q = [0.5, 0.2, 0.1]
        p, q = [*p, 1 - sum(p)], [*q, 1 - sum(q)]
        per_token.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True)))
    stats = eng.train_step([mb])
    # seq-mean: the second sample has no top-K, so only the first one's mean counts
    assert stats.topk_kl == pytest.approx(sum(per_token) / len(per_token), rel=1e-4)
    assert stats.loss == pytest.approx(stats.pg_loss + 0.5 * stats.topk_kl, abs=1e-6)


def test_opd_moves_the_policy_toward_the_teacher() -> None:
    eng = engine("opd", kl_coef=0.1, entropy_coef=0.01)
    mbs = micro_batches(samples([0.0, 0.0, 0.0], teacher=True), 2, pad_id=0)
    before = eng.parameters_snapshot()
    stats = eng.train_step(mbs)
    assert changed(before, eng.parameters_snapshot())
    assert stats.kl == pytest.approx(0.0, abs=1e-6)  # reference = policy before the step
    assert stats.entropy > 0
    assert eng.train_step(mbs).kl > 0


def test_a_negative_entropy_coef_sharpens_the_policy_and_a_positive_one_flattens_it() -> None:
    """With no reward signal (every advantage 0) only the entropy term moves the policy: a
    penalty (entropy_coef < 0) lowers its entropy over the responses, a bonus raises it."""
    mbs = micro_batches(samples([0.0, 0.0, 0.0, 0.0]), 2, pad_id=0)
    entropies = {}
    for coef in (-1.0, 1.0):
        eng = engine("rl", entropy_coef=coef, weight_decay=0.0)
        entropies[coef] = [eng.train_step(mbs).entropy for _ in range(4)]
        assert entropies[coef][0] == pytest.approx(entropies[-1.0][0])  # the same start
    low, high = entropies[-1.0], entropies[1.0]
    assert all(b < a for a, b in itertools.pairwise(low)), entropies
    assert all(b > a for a, b in itertools.pairwise(high)), entropies


def test_a_contrastive_teacher_gap_is_hinted_minus_neutral_whatever_the_policy_says() -> None:
    """Samples whose teacher log-probs are hinted - neutral train on exactly that gap: the
    step's teacher gap is its mean, not teacher - old, and the policy moves."""
    eng = engine("opd", loss_agg="token_mean")
    gaps = [0.5, -0.25, 1.0]
    contrast = [dataclasses.replace(s, teacher_logprobs=gaps[: len(s.response_ids)],
                                    teacher_is_gap=True) for s in samples([0.0, 0.0])]  # fmt: skip
    [mb] = micro_batches(contrast, 2, pad_id=0)
    before = eng.parameters_snapshot()
    stats = eng.train_step([mb])
    taught = [g for s in contrast for g in s.teacher_logprobs or []]
    assert stats.teacher_gap == pytest.approx(sum(taught) / len(taught), abs=1e-6)
    assert stats.pg_loss == pytest.approx(-sum(taught) / len(taught), abs=1e-5)  # ratio 1
    assert changed(before, eng.parameters_snapshot())
    [plain] = micro_batches(samples([0.0, 0.0], teacher=True), 2, pad_id=0)
    old = eng.logprobs(plain)
    taught_tokens = plain.response_mask.bool()
    expected = float((-1.0 - old)[taught_tokens].mean())  # teacher -1.0 less the policy's own
    assert eng.train_step([plain]).teacher_gap == pytest.approx(expected, abs=1e-5)


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
