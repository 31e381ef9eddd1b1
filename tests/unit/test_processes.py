"""Stopping a run's children: together, within one timeout."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.processes import Children, stop_processes
from pipeline.settings import Settings


def child(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", "-c", script], start_new_session=True)


def test_children_stop_together_and_stubborn_ones_are_killed(tmp_path: Path) -> None:
    children = Children()
    polite = [children.add(child("sleep 60")) for _ in range(3)]
    ready = [tmp_path / f"trapped{i}" for i in range(2)]
    stubborn = [
        children.add(child(f"trap '' TERM; touch {r}; while true; do sleep 0.1; done"))
        for r in ready
    ]
    deadline = time.monotonic() + 30
    while not all(r.exists() for r in ready):  # each has its trap set
        assert time.monotonic() < deadline, "the stubborn children did not start"
        time.sleep(0.05)
    stop_processes(children.procs, timeout_s=3.0)
    assert all(p.poll() is not None for p in [*polite, *stubborn])
    assert all(p.returncode == -9 for p in stubborn) and all(p.returncode == -15 for p in polite)
    children.stop()  # stopping again is harmless


class Clocked:
    """A child process on a made-up clock: it exits at ``exits_at`` once told to stop
    (None: it ignores SIGTERM), and each wait moves the clock on by what it waited."""

    def __init__(self, pid: int, clock: list[float], exits_at: float | None) -> None:
        self.pid, self.clock, self.exits_at = pid, clock, exits_at
        self.returncode: int | None = None
        self.waits: list[float | None] = []

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if self.returncode is None and timeout is None:  # after SIGKILL
            self.returncode = -9
        if self.returncode is None:
            if self.exits_at is not None and self.exits_at <= self.clock[0] + timeout:
                self.clock[0] = max(self.clock[0], self.exits_at)
                self.returncode = -15
            else:
                self.clock[0] += timeout
                raise subprocess.TimeoutExpired("child", timeout)
        return self.returncode


def test_a_stop_takes_one_timeout_for_all_not_one_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline import processes

    clock = [100.0]
    signals: list[tuple[int, int]] = []
    monkeypatch.setattr(processes.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(processes.os, "killpg", lambda pid, sig: signals.append((pid, sig)))
    polite = Clocked(1, clock, exits_at=101.0)  # one second after SIGTERM
    stubborn = [Clocked(2, clock, None), Clocked(3, clock, None)]
    stop_processes([polite, *stubborn], timeout_s=3.0)  # type: ignore[list-item]
    # the polite one is given 3 s and takes 1; the first stubborn one the 2 s left,
    # the second nothing more: 3 s in all, where a timeout each would take 9
    assert [polite.waits, stubborn[0].waits, stubborn[1].waits] == [[3.0], [2.0, None], [0.0, None]]
    assert clock[0] == 103.0
    term, kill = signal.SIGTERM, signal.SIGKILL
    assert signals == [(1, term), (2, term), (3, term), (2, kill), (3, kill)]
    assert [p.returncode for p in (polite, *stubborn)] == [-15, -9, -9]


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
