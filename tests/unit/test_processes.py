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


def test_a_runs_trainer_starts_from_the_model_not_an_earlier_runs_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` run twice: the second run resumed the first one's trainer (step 16 of 16
    already done), pushed nothing and reported the old ledger. Each run's trainer starts in a
    fresh directory, for the live stack and the recorded demo alike."""
    from pipeline import demo
    from pipeline.learn import stack

    spawned: list[list[str]] = []
    fake = lambda args, env, log: spawned.append(args)  # noqa: E731 (no process started)
    monkeypatch.setattr(stack, "spawn_cli", fake)
    monkeypatch.setattr(demo, "_spawn", fake)
    settings = Settings()
    starts = {
        "live": lambda: stack.start_trainer(settings, tmp_path / "m", "http://x", tmp_path, {}),
        "recorded": lambda: demo.start_trainer(settings, tmp_path / "recorded"),
    }
    for name, start in starts.items():
        start()
        trainer = (tmp_path if name == "live" else tmp_path / "recorded") / "trainer"
        for old in ("ckpt/step00000016/model.pt", "ledger.tsv", "metrics.jsonl"):
            (trainer / old).parent.mkdir(parents=True, exist_ok=True)
            (trainer / old).write_text("an earlier run")
        start()
        assert not (trainer / "ckpt").exists(), name
        assert not (trainer / "ledger.tsv").exists() and not (trainer / "metrics.jsonl").exists()
    assert len(spawned) == 4 and all(args[0] == "train" for args in spawned)
    assert (tmp_path / "trainer" / "trainer.yaml").exists()  # the live run's config is rewritten
