"""The KL to the initial policy: measured every step, from a top-layer copy when only the top
layers train, equal to a full copy's, and penalised with kl_coef (real DeepSpeed steps, CPU)."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest
import torch
from prometheus_client import REGISTRY
from transformers import LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from pipeline.errors import ConfigError
from pipeline.training.batch import MicroBatch, TokenizedSample, micro_batches, step_baseline
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine, build_model, freeze_below_top, token_logprobs
from pipeline.training.metrics import MetricsSink
from pipeline.training.reference import FullReference, TopReference, build_reference
from tests.servers import tiny_llama_config
from tests.tiny_policy import TINY, VOCAB


def config(**kw) -> TrainerConfig:  # type: ignore[no-untyped-def]
    options = {"lr": 1e-2, "micro_batch_size": 2, "tiny_model": TINY, "train_top_layers": 1}
    return TrainerConfig(**{**options, **kw})  # type: ignore[arg-type]


def samples(rewards: list[float]) -> list[TokenizedSample]:
    """Samples of different lengths, so every micro-batch has right padding."""
    out = []
    for i, r in enumerate(rewards):
        prompt = [(i * 7 + j) % VOCAB for j in range(4 + 2 * i)]
        response = [(i * 5 + j + 1) % VOCAB for j in range(3 + i % 2)]
        out.append(TokenizedSample(f"s:{i}", prompt, response, r, None, None, 0))
    return out


def batches(rewards: list[float]) -> list[MicroBatch]:
    return micro_batches(samples(rewards), 2, pad_id=0)


def real_positions(mb: MicroBatch) -> torch.Tensor:
    return mb.attention_mask[:, 1:].bool()


def k3_by_hand(policy: list[torch.Tensor], ref: list[torch.Tensor], mbs: list[MicroBatch]) -> float:
    """Mean over samples of each one's mean over its response tokens of r - 1 - log r,
    r = pi_ref / pi (seq_mean_token_mean), in plain floats."""
    per_sample = []
    for logp, rlogp, mb in zip(policy, ref, mbs, strict=True):
        for b in range(mb.input_ids.shape[0]):
            terms = []
            for t in mb.response_mask[b].nonzero().flatten().tolist():
                log_r = float(rlogp[b, t]) - float(logp[b, t])
                terms.append(math.exp(log_r) - 1.0 - log_r)
            per_sample.append(sum(terms) / len(terms))
    return sum(per_sample) / len(per_sample)


@pytest.mark.parametrize("top", [1, 2, 3])
def test_the_top_layer_reference_equals_a_full_copy_after_the_policy_trained(top: int) -> None:
    c = config(train_top_layers=top)
    eng = PolicyEngine(c, vocab_size=VOCAB)
    assert isinstance(eng.reference, TopReference)
    mbs = batches([1.0, -1.0, 1.0, -0.5])
    for _ in range(3):
        eng.train_step(mbs)
    full = FullReference(build_model(c, VOCAB), "cpu")  # the same seed: the initial weights
    for mb in mbs:
        top_ref, full_ref = eng.reference_logprobs(mb), full.logprobs(mb)
        assert top_ref is not None
        real = real_positions(mb)
        assert torch.allclose(top_ref[real], full_ref[real], atol=1e-5)
        moved = (eng.logprobs(mb)[real] - full_ref[real]).abs().max()
        assert moved > 1e-2, "the policy did not move away from its initial weights"


def test_the_kl_is_measured_without_a_penalty_and_equals_its_hand_value() -> None:
    eng = PolicyEngine(config(), vocab_size=VOCAB)
    mbs = batches([1.0, -1.0, 1.0, -1.0])
    first = eng.train_step(mbs)
    assert first.kl == pytest.approx(0.0, abs=1e-7)  # step 1 runs on the initial weights
    eng.train_step(mbs)
    full = FullReference(build_model(config(), VOCAB), "cpu")
    policy = [eng.logprobs(mb) for mb in mbs]
    expected = k3_by_hand(policy, [full.logprobs(mb) for mb in mbs], mbs)
    assert expected > 1e-4  # a reference that differs from the policy
    third = eng.train_step(mbs)  # its KL is the policy's before this step's update
    assert third.kl == pytest.approx(expected, rel=1e-4)
    assert third.loss == pytest.approx(third.pg_loss, abs=1e-7)  # measured, not penalised


def test_kl_coef_adds_the_penalty_and_keeps_the_policy_nearer_its_initial_weights() -> None:
    mbs = batches([1.0, -1.0, 1.0, -1.0])
    free = PolicyEngine(config(), vocab_size=VOCAB)
    held = PolicyEngine(config(kl_coef=10.0), vocab_size=VOCAB)
    for _ in range(4):
        free.train_step(mbs)
        held_stats = held.train_step(mbs)
    assert held_stats.kl > 0.0
    assert held_stats.loss == pytest.approx(held_stats.pg_loss + 10.0 * held_stats.kl, abs=1e-6)
    full = FullReference(build_model(config(), VOCAB), "cpu")
    refs = [full.logprobs(mb) for mb in mbs]
    kl = [k3_by_hand([e.logprobs(mb) for mb in mbs], refs, mbs) for e in (free, held)]
    assert kl[1] < 0.25 * kl[0], kl  # the penalty held the policy back (0.005 vs 0.08)


def test_which_reference_is_kept() -> None:
    model = build_model(config(), VOCAB)
    assert isinstance(build_reference(config(), model, "cpu"), TopReference)
    assert isinstance(build_reference(config(train_top_layers=None), model, "cpu"), FullReference)
    zero3 = config(zero_stage=3, update_weights_interval=0)
    assert isinstance(build_reference(zero3, model, "cpu"), FullReference)
    assert build_reference(config(monitor_kl=False), model, "cpu") is None
    penalised = config(monitor_kl=False, kl_coef=0.1)
    assert isinstance(build_reference(penalised, model, "cpu"), TopReference)


def test_the_top_layer_reference_holds_only_the_top_layers_and_the_norm() -> None:
    model = build_model(config(), VOCAB)
    ref = build_reference(config(), model, "cpu")
    assert isinstance(ref, TopReference)
    copied = sum(p.numel() for m in (*ref.layers, ref.norm) for p in m.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert copied == trained < sum(p.numel() for p in model.parameters()) / 2
    assert ref.head is model.get_output_embeddings()  # shared, not copied


def test_no_reference_no_kl() -> None:
    eng = PolicyEngine(config(monitor_kl=False), vocab_size=VOCAB)
    mbs = batches([1.0, -1.0])
    assert eng.reference is None and eng.reference_logprobs(mbs[0]) is None
    eng.train_step(mbs)
    assert eng.train_step(mbs).kl == 0.0


def test_a_llama_policys_top_layers_run_from_its_hidden_state_as_its_forward_runs_them() -> None:
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(VOCAB, num_hidden_layers=4)).eval()
    freeze_below_top(model, 2)
    ref = TopReference(model, 2, "cpu")
    for mb in batches([1.0, -1.0, 1.0, 1.0]):
        with torch.no_grad():
            out = model(mb.input_ids, attention_mask=mb.attention_mask, output_hidden_states=True)
            own, _ = token_logprobs(model, mb)
        got = ref.logprobs(mb, out.hidden_states[ref.hidden_layer])
        real = real_positions(mb)
        assert torch.allclose(got[real], own[real], atol=1e-6)


def test_a_sliding_window_model_is_refused_with_what_to_do() -> None:
    sliding = Qwen2Config(
        vocab_size=VOCAB, use_sliding_window=True, sliding_window=4, max_window_layers=1, **TINY
    )
    model = Qwen2ForCausalLM(sliding)
    assert "sliding_attention" in model.config.layer_types
    with pytest.raises(ConfigError, match=r"full-attention layers only.*monitor_kl: false"):
        TopReference(model, 1, "cpu")


def test_a_steps_sentinels_reach_prometheus_and_the_metrics_log(tmp_path: Path) -> None:
    eng = PolicyEngine(config(), vocab_size=VOCAB)
    mbs = batches([1.0, -1.0, 1.0, 0.5])
    eng.train_step(mbs)
    stats = eng.train_step(mbs)
    sink = MetricsSink(str(tmp_path / "metrics.jsonl"), 0, None)
    sink.record({**asdict(stats), "policy_version": 2})
    [row] = [orjson.loads(line) for line in (tmp_path / "metrics.jsonl").read_bytes().splitlines()]
    assert stats.kl > 0 and stats.entropy > 0 and stats.response_length > 0
    for name in ("reward_mean", "response_length", "entropy", "kl"):
        assert row[name] == getattr(stats, name)
        assert REGISTRY.get_sample_value(f"turnstream_trainer_{name}") == pytest.approx(row[name])
    assert row["reward_mean"] == pytest.approx(0.375)


def test_kl_coef_pulls_back_a_policy_whose_step_has_no_reward_signal() -> None:
    """A step whose samples all scored the same (every answer rejected) gives the step-mean
    baseline no advantage at all: without kl_coef only Adam's momentum from the steps before
    moves the weights; with it, the KL to the initial weights falls at every step, and much
    further."""
    drift = batches([1.0, -1.0, 1.0, -1.0])
    centred = step_baseline(samples([-1.0] * 4), "mean")
    assert [s.reward for s in centred] == [0.0] * 4
    flat = micro_batches(centred, 2, pad_id=0)
    full = FullReference(build_model(config(), VOCAB), "cpu")
    refs = [full.logprobs(mb) for mb in flat]

    def kl(e: PolicyEngine) -> float:
        return k3_by_hand([e.logprobs(mb) for mb in flat], refs, flat)

    kls: dict[float, list[float]] = {}
    for coef in (0.0, 1.0):
        eng = PolicyEngine(config(kl_coef=coef, weight_decay=0.0), vocab_size=VOCAB)
        for _ in range(4):  # away from the initial weights (less far with the penalty)
            eng.train_step(drift)
        kls[coef] = [kl(eng)]
        assert kls[coef][0] > 1e-3, kls
        for _ in range(4):
            stats = eng.train_step(flat)
            assert stats.pg_loss == pytest.approx(0.0, abs=1e-7)  # no advantage anywhere
            kls[coef].append(kl(eng))
    penalised, free = (kls[c][-1] / kls[c][0] for c in (1.0, 0.0))
    assert all(b < a for a, b in zip(kls[1.0], kls[1.0][1:], strict=False)), kls
    assert penalised < 0.5 * free, kls  # 0.25 of its start against 0.67
