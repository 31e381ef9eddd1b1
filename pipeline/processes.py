"""Child `turnstream` processes started by the commands that run several stages here
(`turnstream demo`, `turnstream learn`): spawned in their own process group, stopped
with SIGTERM then SIGKILL, never left behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pipeline.errors import TurnstreamError


def die_with_parent() -> None:
    """Linux: the child gets SIGTERM if its parent dies without cleaning up (kill -9)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn_cli(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`turnstream ARGS` as a child in its own process group (Ctrl-C reaches the parent
    only; the parent stops the child), its output in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def fresh_dir(path: Path) -> Path:
    """``path`` as an empty directory. What an earlier run left there (a trainer's
    checkpoints, ledger and metrics) is removed: a new run would otherwise resume the old
    trainer, find its steps already done, and report the old run's figures."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def stop_processes(procs: list[subprocess.Popen[bytes]], timeout_s: float = 30.0) -> None:
    """SIGTERM to each process group at once, ``timeout_s`` for all of them to exit, then
    SIGKILL to what is left: a stop takes one timeout, not one per process."""
    live = [p for p in procs if p.poll() is None]
    for proc in live:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Children:
    """The child processes a run started, stopped together (:func:`stop_processes`)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def add(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        stop_processes(self.procs)


def tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def wait_http_ok(
    url: str, proc: subprocess.Popen[bytes], log: Path, what: str, timeout_s: float = 300.0
) -> None:
    """Wait until GET ``url`` answers 200; a child that exits first is an error with its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TurnstreamError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise TurnstreamError(f"{what} did not answer {url} within {timeout_s:.0f}s; see {log}")
