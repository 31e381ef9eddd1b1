"""train_from_frozen_states: the training pass runs the top layers on the frozen layers'
output kept from the pass before the update, and trains exactly as the whole pass does."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.batch import MicroBatch, TokenizedSample, micro_batches
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine
from pipeline.training.top_layers import build_top_layers
from tests.tiny_policy import TINY, VOCAB


def _batch(signals: bool = False) -> list[TokenizedSample]:
    """Prompts and responses of different lengths: the micro-batches are padded. ``signals``:
    rollout log-probs that differ from the trainer's (some unknown) and teacher log-probs
    on every other sample."""
    out = []
    for i, r in enumerate([1.0, -1.0, 1.0, -1.0, 0.5, -0.5]):
        response = [5 + i, 6, 7, 8][: 1 + i % 4]
        rollout = [-1.0 - 0.3 * j if j != 1 else math.nan for j in range(len(response))]
        teacher = [-0.5 - 0.2 * j for j in range(len(response))] if i % 2 else None
        out.append(
            TokenizedSample(
                f"s:{i}", [1 + i, 2, 3, 4][: 2 + i % 3], response, r,
                rollout if signals else None, teacher if signals else None, 0,
            )
        )  # fmt: skip
    return out


@pytest.mark.parametrize(
    ("monitor_kl", "mode"), [(False, "rl"), (True, "rl"), (True, "combine"), (False, "opd")]
)
def test_two_steps_from_the_kept_states_equal_two_steps_of_the_whole_pass(
    monitor_kl: bool, mode: str
) -> None:
    """The kept states' step (the frozen layers alone before the update, the training
    pass's log-probs as the proximal ones) against the whole passes: the same updates and
    figures, with rollout and teacher log-probs that differ from the trainer's in
    combine and opd."""
    results = {}
    signals = mode != "rl"
    for kept in (True, False):
        config = TrainerConfig(
            lr=1e-2, micro_batch_size=3, tiny_model=TINY, train_top_layers=2,
            train_from_frozen_states=kept, monitor_kl=monitor_kl, seed=5, mode=mode,
            teacher_adv_clip=1.0 if signals else None,
        )  # fmt: skip
        engine = PolicyEngine(config, vocab_size=VOCAB)
        assert (engine.top is not None) is kept
        metrics = [engine.train_step(micro_batches(_batch(signals), 3, pad_id=0)) for _ in range(2)]
        params = {n: p.detach().clone() for n, p in engine.engine.module.named_parameters()}
        results[kept] = (metrics, params)
    (kept_metrics, kept_params), (whole_metrics, whole_params) = results[True], results[False]
    assert any(not torch.equal(kept_params[n], p) for n, p in _initial().items())  # it trained
    for name, param in whole_params.items():
        assert torch.allclose(kept_params[name], param, atol=_atol(name)), name
    for a, b in zip(kept_metrics, whole_metrics, strict=True):
        for name in ("loss", "pg_loss", "entropy", "kl", "ppo_kl", "pg_clipfrac", "rollout_kl",
                     "tis_weight_mean", "teacher_gap"):  # fmt: skip
            assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-6), name
        assert a.train_rollout_logprob_abs_diff == pytest.approx(
            b.train_rollout_logprob_abs_diff, abs=1e-6
        )
    if signals:
        assert kept_metrics[0].rollout_kl > 0 and kept_metrics[0].teacher_gap != 0


def _shared_batch() -> list[TokenizedSample]:
    """Prompts that start with the same 10 tokens (a system prompt), then questions and
    responses of different lengths; every other one with teacher log-probs."""
    system = [9, 3, 11, 4, 12, 5, 13, 6, 14, 7]
    out = []
    for i, r in enumerate([1.0, -1.0, 1.0, -1.0, 0.5, -0.5]):
        question = [20 + i, 30 + i, 40][: 1 + i % 3]
        response = [5 + i, 6, 7, 8, 50][: 1 + (i * 2) % 5]
        teacher = [-0.5 - 0.2 * j for j in range(len(response))] if i % 2 else None
        out.append(TokenizedSample(f"s:{i}", [*system, *question], response, r, None, teacher, 0))
    return out


@pytest.mark.parametrize("mode", ["rl", "combine"])
def test_rows_that_start_alike_run_their_start_once_and_train_as_the_whole_pass(
    mode: str,
) -> None:
    """Micro-batches whose prompts share a 10-token system prompt: the frozen layers, the
    policy's top layers (with their gradient) and the reference's run it once; two steps
    make the updates and figures of the whole passes over every row."""
    results = {}
    for kept in (True, False):
        config = TrainerConfig(
            lr=1e-2, micro_batch_size=3, tiny_model=TINY, train_top_layers=2,
            train_from_frozen_states=kept, monitor_kl=True, seed=5, mode=mode,
            teacher_adv_clip=1.0 if mode != "rl" else None,
        )  # fmt: skip
        engine = PolicyEngine(config, vocab_size=VOCAB)
        mbs = micro_batches(_shared_batch(), 3, pad_id=0)
        assert [mb.shared_prefix for mb in mbs] == [10, 10]
        metrics = [engine.train_step(mbs) for _ in range(2)]
        if kept:
            assert engine.top is not None and engine.top.shared_positions == 2 * 2 * 2 * 10
        params = {n: p.detach().clone() for n, p in engine.engine.module.named_parameters()}
        results[kept] = (metrics, params)
    (kept_metrics, kept_params), (whole_metrics, whole_params) = results[True], results[False]
    assert any(not torch.equal(kept_params[n], p) for n, p in _initial().items())  # it trained
    for name, param in whole_params.items():
        # Adam's steps are lr's size (1e-2) whatever a gradient's: where one is near 0, the
        # orders of summing move a weight by up to 0.5% of lr (4e-5 seen); 1% of lr here
        assert torch.allclose(kept_params[name], param, atol=1e-4), name
    for a, b in zip(kept_metrics, whole_metrics, strict=True):
        for name in ("loss", "pg_loss", "entropy", "kl", "teacher_gap"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-6), name
    assert kept_metrics[1].kl > 0  # the second step's policy differs from the reference


def test_a_micro_batchs_shared_prefix_stops_before_its_first_response_and_shortest_row() -> None:
    def mb(prompts: list[list[int]], responses: list[list[int]]) -> MicroBatch:
        samples = [TokenizedSample(f"s:{i}", p, r, 1.0, None, None, 0)
                   for i, (p, r) in enumerate(zip(prompts, responses, strict=True))]  # fmt: skip
        return micro_batches(samples, len(samples), pad_id=0)[0]

    start = list(range(1, 13))  # 12 tokens alike
    assert mb([[*start, 20], [*start, 21, 22]], [[5], [6]]).shared_prefix == 12
    # the first response position is the 12th (the last prompt token predicts it)
    assert mb([start, [*start, 21]], [[5], [6]]).shared_prefix == 11
    # a row with no response (a rank's pad) and a prompt of 10 tokens: at most 9
    assert mb([start[:10], [*start, 7]], [[], [6]]).shared_prefix == 9
    assert mb([start[:8], [*start, 7]], [[], [6]]).shared_prefix == 0  # under the minimum
    assert mb([[*start, 20]], [[5]]).shared_prefix == 0  # one row shares with nobody
    assert mb([[0, *start], [*start, 1]], [[5], [6]]).shared_prefix == 0


def _atol(name: str) -> float:
    """Adam divides a gradient by its own size, so where one is near 0 the two orders of
    summing that the passes take become steps up to lr's size (1e-2 here): on some CPUs a
    query projection's weights differ by 4e-6 after two steps. A key projection's bias
    moves no attention weight (softmax takes a constant per query away): its gradient is
    rounding alone, and it differs by 1e-5."""
    return 1e-4 if name.endswith("k_proj.bias") else 1e-5


def _initial() -> dict[str, torch.Tensor]:
    config = TrainerConfig(tiny_model=TINY, train_top_layers=2, seed=5, monitor_kl=False)
    engine = PolicyEngine(config, vocab_size=VOCAB)
    return {n: p.detach().clone() for n, p in engine.engine.module.named_parameters()}


def test_a_model_with_dropout_or_training_whole_runs_the_whole_pass() -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    model = AutoModelForCausalLM.from_config(
        Qwen2Config(vocab_size=VOCAB, attention_dropout=0.1, **TINY)
    )
    assert build_top_layers(TrainerConfig(train_top_layers=1), model) is None
    model.config.attention_dropout = 0.0
    assert build_top_layers(TrainerConfig(train_top_layers=1), model) is not None
    model.config.resid_pdrop = 0.1  # a dropout under another name (Phi-style)
    assert build_top_layers(TrainerConfig(train_top_layers=1), model) is None
    model.config.resid_pdrop = 0.0
    model.config.embedding_multiplier = 12.0  # Granite-style scaled embeddings
    assert build_top_layers(TrainerConfig(train_top_layers=1), model) is None
    model.config.embedding_multiplier = 1.0
    assert build_top_layers(TrainerConfig(), model) is None  # every layer trains
    assert build_top_layers(TrainerConfig(train_top_layers=1, zero_stage=3,
                                          update_weights_interval=0), model) is None  # fmt: skip
