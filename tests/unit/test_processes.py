"""Stopping a run's children: together, within one timeout."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pipeline.processes import Children, stop_processes
from pipeline.settings import Settings


def child(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def test_children_stop_together_within_one_timeout_and_stubborn_ones_are_killed() -> None:
    children = Children()
    polite = [children.add(child("sleep 60")) for _ in range(3)]
    stubborn = [
        children.add(child("trap '' TERM; while true; do sleep 0.1; done")) for _ in range(2)
    ]
    time.sleep(0.3)  # the trap is set
    started = time.monotonic()
    stop_processes(children.procs, timeout_s=3.0)
    took = time.monotonic() - started
    assert all(p.poll() is not None for p in [*polite, *stubborn])
    assert all(p.returncode == -9 for p in stubborn) and all(p.returncode == -15 for p in polite)
    assert took < 5.0  # one timeout (3 s) for both stubborn ones, not one each (6 s)
    children.stop()  # stopping again is harmless


def test_a_live_runs_trainer_starts_from_the_model_not_an_earlier_runs_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` run twice: the second run resumed the first one's trainer (step 16 of 16
    already done), pushed nothing and reported the old ledger. A live run (new topics, the
    policy served from the model) starts its trainer in a fresh directory. (The recorded
    demo, run again, carries on on the same topics on purpose: tests/kafka/test_demo.py.)"""
    from pipeline.learn import stack

    spawned: list[list[str]] = []
    monkeypatch.setattr(stack, "spawn_cli", lambda args, env, log: spawned.append(args))
    settings = Settings()
    stack.start_trainer(settings, tmp_path / "m", "http://x", tmp_path, {})
    trainer = tmp_path / "trainer"
    for old in ("ckpt/step00000016/model.pt", "ledger.tsv", "metrics.jsonl"):
        (trainer / old).parent.mkdir(parents=True, exist_ok=True)
        (trainer / old).write_text("an earlier run")
    stack.start_trainer(settings, tmp_path / "m", "http://x", tmp_path, {})
    assert not (trainer / "ckpt").exists()
    assert not (trainer / "ledger.tsv").exists() and not (trainer / "metrics.jsonl").exists()
    assert (trainer / "trainer.yaml").exists()  # the new run's config
    assert len(spawned) == 2 and all(args[0] == "train" for args in spawned)
