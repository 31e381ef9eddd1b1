"""checkpoint_frozen false: a checkpoint holds the parameters that train (and the optimizer),
a resume takes the frozen rest from the model it builds, and ends with the same weights."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.training.batch import TokenizedSample, micro_batches
from pipeline.training.checkpoint import Checkpoints, TrainerState
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine
from tests.tiny_policy import TINY, VOCAB


def _trained(config: TrainerConfig) -> PolicyEngine:
    engine = PolicyEngine(config, vocab_size=VOCAB)
    batch = [
        TokenizedSample(f"s:{i}", [1 + i, 2, 3, 4], [5 + i, 6, 7], r, None, None, 0)
        for i, r in enumerate([1.0, -1.0, 1.0, -1.0])
    ]
    engine.train_step(micro_batches(batch, 2, pad_id=0))
    return engine


def _saved_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def test_a_checkpoint_without_the_frozen_parameters_resumes_to_the_same_weights(
    tmp_path: Path,
) -> None:
    config = TrainerConfig(lr=1e-2, micro_batch_size=2, tiny_model=TINY, train_top_layers=1)
    engine = _trained(config)
    trained = {n: p.detach().clone() for n, p in engine.engine.module.named_parameters()}
    Checkpoints(engine.engine, tmp_path / "all", 1).save(TrainerState(step=1), "step00000001")
    light = Checkpoints(engine.engine, tmp_path / "light", 1, frozen=False)
    light.save(TrainerState(step=1), "step00000001")
    assert _saved_bytes(tmp_path / "light") < 0.8 * _saved_bytes(tmp_path / "all")

    fresh = PolicyEngine(config, vocab_size=VOCAB)  # the frozen rest, rebuilt as it was
    top = [n for n, p in fresh.engine.module.named_parameters() if p.requires_grad]
    assert any(not torch.equal(dict(fresh.engine.module.named_parameters())[n], trained[n])
               for n in top)  # fmt: skip
    state = Checkpoints(fresh.engine, tmp_path / "light", 1, frozen=False).load()
    assert state.step == 1
    for name, param in fresh.engine.module.named_parameters():
        assert torch.equal(param.detach(), trained[name]), name
