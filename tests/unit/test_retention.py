"""The trainer keeps its newest checkpoints and weight versions, and deletes the rest."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.settings import Settings
from pipeline.training import retention
from pipeline.training.config import TrainerConfig
from pipeline.training.retention import prune_checkpoints, prune_weight_versions
from pipeline.training.trainer import Trainer
from pipeline.training.weights import WeightPushError


def names(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def checkpoints(ckpt: Path, steps: list[int], latest: int) -> None:
    """What DeepSpeed leaves in a checkpoint_dir: one directory per tag, `latest`, a script."""
    for step in steps:
        (ckpt / f"step{step:08d}").mkdir(parents=True)
        (ckpt / f"step{step:08d}" / "mp_rank_00_model_states.pt").write_bytes(b"w")
    (ckpt / "latest").write_text(f"step{latest:08d}")
    (ckpt / "zero_to_fp32.py").write_text("")


def test_older_checkpoints_beyond_keep_are_deleted_oldest_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints(tmp_path, [1, 2, 3, 9, 10], latest=10)
    with caplog.at_level(logging.INFO, logger=retention.__name__):
        removed = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step00000001", "step00000002", "step00000003"]
    assert names(tmp_path) == {"step00000009", "step00000010", "latest", "zero_to_fp32.py"}
    assert "step00000001, step00000002, step00000003" in caplog.text
    assert prune_checkpoints(tmp_path, keep=2) == []


def test_the_checkpoint_latest_names_is_never_deleted(tmp_path: Path) -> None:
    # step 4 and 5 were being written when the process died: a restart resumes from 3.
    checkpoints(tmp_path, [1, 2, 3, 4, 5], latest=3)
    removed = prune_checkpoints(tmp_path, keep=1)
    assert [p.name for p in removed] == ["step00000001", "step00000002", "step00000004"]
    assert names(tmp_path) == {"step00000003", "step00000005", "latest", "zero_to_fp32.py"}


def test_the_loaded_weight_version_is_never_deleted(tmp_path: Path) -> None:
    for version in (1, 2, 3, 4):
        (tmp_path / f"v{version:06d}").mkdir()
    (tmp_path / "v000005.partial").mkdir()  # not a version: left alone
    (tmp_path / "v000000").write_text("")  # a file, not a version directory
    removed = prune_weight_versions(tmp_path, keep=1, loaded=tmp_path / "v000002")
    assert [p.name for p in removed] == ["v000001", "v000003"]
    assert names(tmp_path) == {"v000002", "v000004", "v000005.partial", "v000000"}


def test_missing_directories_and_failed_deletes_are_not_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert prune_checkpoints(tmp_path / "absent", keep=2) == []
    checkpoints(tmp_path, [1, 2, 3, 4], latest=4)

    def rmtree(path: Path) -> None:
        if path.name == "step00000001":
            raise FileNotFoundError(path)  # deleted by someone else meanwhile
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(retention.shutil, "rmtree", rmtree)
    assert prune_checkpoints(tmp_path, keep=2) == []
    assert "could not delete" in caplog.text and "step00000002" in caplog.text
    with pytest.raises(ValueError, match="keep must be >= 1"):
        prune_checkpoints(tmp_path, keep=0)


class FakeDeepSpeed:
    """Writes what DeepSpeed's save_checkpoint and save_pretrained leave on disk."""

    def __init__(self) -> None:
        self.fail = False
        self.module = SimpleNamespace(save_pretrained=self._save_pretrained)

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict[str, Any]) -> None:
        if self.fail:
            raise OSError(28, "No space left on device")
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / tag / "mp_rank_00_model_states.pt").write_bytes(b"w")
        (Path(save_dir) / "latest").write_text(tag)

    @staticmethod
    def _save_pretrained(path: str, safe_serialization: bool) -> None:
        (Path(path) / "model.safetensors").write_bytes(b"w")


def test_the_trainer_keeps_the_newest_checkpoints_and_weight_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        weights_dir=str(tmp_path / "weights"),
        keep_checkpoints=2,
        keep_weight_versions=3,
        metrics_jsonl=None,
    )
    deepspeed = FakeDeepSpeed()
    trainer = Trainer(Settings(), config, SimpleNamespace(engine=deepspeed), tokenizer=None)
    trainer.source.consumer = SimpleNamespace(commit=lambda offsets, **kw: None)
    out = SimpleNamespace(
        flush=lambda timeout=None: None,
        send=lambda *a, **kw: SimpleNamespace(failed=lambda: False, succeeded=lambda: True),
    )

    def step(n: int) -> None:
        trainer.state.step = n
        trainer._push_weights(out, n)  # type: ignore[arg-type]
        trainer._checkpoint_and_commit(out, [])  # type: ignore[arg-type]

    for n in range(1, 6):
        step(n)
    assert names(tmp_path / "ckpt") == {"step00000004", "step00000005", "latest"}
    assert names(tmp_path / "weights") == {"v000003", "v000004", "v000005"}

    # Nothing is deleted for a checkpoint or a push that did not succeed.
    deepspeed.fail = True
    monkeypatch.setattr(
        "pipeline.training.trainer.push_to_servers",
        lambda *_args: (_ for _ in ()).throw(WeightPushError("policy server down")),
    )
    with pytest.raises(OSError, match="No space left"):
        step(6)
    assert names(tmp_path / "ckpt") == {"step00000004", "step00000005", "latest"}
    assert names(tmp_path / "weights") == {"v000003", "v000004", "v000005", "v000006"}
    assert trainer.state.policy_version == 5
