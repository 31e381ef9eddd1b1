"""Stopping a run's children: together, within one timeout."""

from __future__ import annotations

import subprocess
import time

from pipeline.processes import Children, stop_processes


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
