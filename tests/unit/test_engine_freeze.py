"""train_top_layers: a step changes the top layers only; the rest of the policy stays as it was."""

from __future__ import annotations

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.training.batch import TokenizedSample, micro_batches
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine, build_model
from tests.tiny_policy import TINY, VOCAB


def test_a_step_trains_the_top_layers_and_leaves_the_rest_untouched() -> None:
    config = TrainerConfig(lr=1e-2, micro_batch_size=2, tiny_model=TINY, train_top_layers=1)
    engine = PolicyEngine(config, vocab_size=VOCAB)
    model = engine.engine.module
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    batch = [
        TokenizedSample(f"s:{i}", [1 + i, 2, 3, 4], [5 + i, 6, 7], r, None, None, 0)
        for i, r in enumerate([1.0, -1.0, 1.0, -1.0])
    ]
    engine.train_step(micro_batches(batch, 2, pad_id=0))
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved, "the top layer did not train"
    assert all(n.startswith(("model.layers.2.", "model.norm.")) for n in moved), moved
    assert any(n.startswith("model.layers.2.") for n in moved)


def test_more_top_layers_than_the_model_has_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="train_top_layers is 4 but the model has 3 layers"):
        build_model(TrainerConfig(tiny_model=TINY, train_top_layers=4), VOCAB)
    with pytest.raises(ValueError, match="train_top_layers must be >= 1"):
        TrainerConfig(train_top_layers=0)
