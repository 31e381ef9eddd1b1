"""The trainer's learning-rate schedule: warm-up steps, then constant or a half cosine down to
lr_min_ratio at max_steps; each step reports its lr, and a checkpoint resumes the schedule
where it was (real DeepSpeed steps on a tiny random policy, CPU)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine, lr_factor
from tests.tiny_policy import TINY, VOCAB
from tests.unit.test_reference import batches


def config(**kw) -> TrainerConfig:  # type: ignore[no-untyped-def]
    options = {"lr": 1e-2, "micro_batch_size": 2, "tiny_model": TINY, "train_top_layers": 1}
    return TrainerConfig(**{**options, **kw})  # type: ignore[arg-type]


def test_warmup_then_a_half_cosine_to_the_min_ratio_by_hand() -> None:
    c = config(lr_schedule="cosine", lr_warmup_steps=2, max_steps=6, lr_min_ratio=0.1)
    # steps 0, 1 warm up (1/3, 2/3); steps 2..5 run the cosine from 1 to 0.1 over 3 intervals
    cosine = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(4)]
    expected = [1 / 3, 2 / 3, *cosine]
    assert [lr_factor(k, c) for k in range(6)] == pytest.approx(expected)
    assert expected[2:] == pytest.approx([1.0, 0.775, 0.325, 0.1])
    assert lr_factor(9, c) == pytest.approx(0.1)  # past max_steps: the floor
    flat = config(lr_warmup_steps=1)
    assert [lr_factor(k, flat) for k in range(3)] == [0.5, 1.0, 1.0]
    assert [lr_factor(k, config()) for k in range(3)] == [1.0, 1.0, 1.0]


def test_the_config_refuses_a_cosine_without_its_end_and_bad_ratios() -> None:
    with pytest.raises(ValueError, match="lr_schedule cosine needs max_steps"):
        config(lr_schedule="cosine")
    with pytest.raises(ValueError, match="lr_min_ratio within"):
        config(lr_schedule="cosine", max_steps=4, lr_min_ratio=1.5)
    with pytest.raises(ValueError, match="lr_warmup_steps must be >= 0"):
        config(lr_warmup_steps=-1)


def test_each_step_reports_its_lr_and_a_checkpoint_resumes_the_schedule(tmp_path: Path) -> None:
    c = config(lr_schedule="cosine", lr_warmup_steps=1, max_steps=5, lr_min_ratio=0.2)
    mbs = batches([1.0, -1.0, 1.0, -1.0])
    eng = PolicyEngine(c, vocab_size=VOCAB)
    seen = [eng.train_step(mbs).lr for _ in range(3)]
    assert seen == pytest.approx([1e-2 * lr_factor(k, c) for k in range(3)])
    assert seen[0] == pytest.approx(5e-3) and seen[1] == pytest.approx(1e-2)
    eng.engine.save_checkpoint(str(tmp_path), tag="s3")
    resumed = PolicyEngine(c, vocab_size=VOCAB)
    resumed.engine.load_checkpoint(str(tmp_path), tag="s3")
    assert resumed.train_step(mbs).lr == pytest.approx(1e-2 * lr_factor(3, c))
    assert eng.train_step(mbs).lr == pytest.approx(1e-2 * lr_factor(3, c))


def test_a_step_without_update_keeps_weights_and_adam_moments_and_moves_the_schedule() -> None:
    """After one real step (Adam's moments are non-zero), a step with update False changes
    no weight and no moment, is measured (its reward mean and entropy), counted, and the lr
    of the next real step is the schedule's third; that step moves the weights again."""
    import torch

    c = config(lr_schedule="cosine", max_steps=4, lr_min_ratio=0.2)
    eng = PolicyEngine(c, vocab_size=VOCAB)
    eng.train_step(batches([1.0, -1.0, 1.0, -1.0]))
    params = [p for p in eng.engine.module.parameters() if p.requires_grad]
    weights = [p.detach().clone() for p in params]
    adam = getattr(eng.engine.optimizer, "optimizer", eng.engine.optimizer)  # inside ZeRO's
    moments = {
        i: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)}
        for i, v in enumerate(adam.state.values())
    }
    assert moments and any(float(m["exp_avg"].abs().sum()) > 0 for m in moments.values())

    held = eng.train_step(batches([-1.0, -1.0, -1.0, -1.0]), update=False)
    assert held.step == 2 and held.reward_mean == -1.0 and held.entropy > 0
    assert held.lr == pytest.approx(1e-2 * lr_factor(1, c))
    assert all(torch.equal(w, p.detach()) for w, p in zip(weights, params, strict=True))
    after = dict(enumerate(adam.state.values()))
    for k, saved in moments.items():
        for name, tensor in saved.items():
            assert torch.equal(tensor, after[k][name]), (k, name)

    moved = eng.train_step(batches([1.0, -1.0, 1.0, -1.0]))
    assert moved.step == 3 and moved.lr == pytest.approx(1e-2 * lr_factor(2, c))
    assert not all(torch.equal(w, p.detach()) for w, p in zip(weights, params, strict=True))
