"""train_from_frozen_states: the training pass runs the top layers on the frozen layers'
output kept from the pass before the update, and trains exactly as the whole pass does."""

from __future__ import annotations

import pytest
import torch

from pipeline.training.batch import TokenizedSample, micro_batches
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine
from pipeline.training.top_layers import build_top_layers
from tests.tiny_policy import TINY, VOCAB


def _batch() -> list[TokenizedSample]:
    """Prompts and responses of different lengths: the micro-batches are padded."""
    return [
        TokenizedSample(
            f"s:{i}", [1 + i, 2, 3, 4][: 2 + i % 3], [5 + i, 6, 7, 8][: 1 + i % 4], r, None, None, 0
        )
        for i, r in enumerate([1.0, -1.0, 1.0, -1.0, 0.5, -0.5])
    ]


@pytest.mark.parametrize("monitor_kl", [False, True])
def test_two_steps_from_the_kept_states_equal_two_steps_of_the_whole_pass(
    monitor_kl: bool,
) -> None:
    results = {}
    for kept in (True, False):
        config = TrainerConfig(
            lr=1e-2, micro_batch_size=3, tiny_model=TINY, train_top_layers=2,
            train_from_frozen_states=kept, monitor_kl=monitor_kl, seed=5,
        )  # fmt: skip
        engine = PolicyEngine(config, vocab_size=VOCAB)
        assert (engine.top is not None) is kept
        metrics = [engine.train_step(micro_batches(_batch(), 3, pad_id=0)) for _ in range(2)]
        params = {n: p.detach().clone() for n, p in engine.engine.module.named_parameters()}
        results[kept] = (metrics, params)
    (kept_metrics, kept_params), (whole_metrics, whole_params) = results[True], results[False]
    assert any(not torch.equal(kept_params[n], p) for n, p in _initial().items())  # it trained
    for name, param in whole_params.items():
        assert torch.allclose(kept_params[name], param, atol=1e-6), name
    for a, b in zip(kept_metrics, whole_metrics, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-6)
        assert a.entropy == pytest.approx(b.entropy, abs=1e-6)
        assert a.kl == pytest.approx(b.kl, abs=1e-6)


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
    assert build_top_layers(TrainerConfig(), model) is None  # every layer trains
    assert build_top_layers(TrainerConfig(train_top_layers=1, zero_stage=3,
                                          update_weights_interval=0), model) is None  # fmt: skip
