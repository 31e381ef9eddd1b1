"""The demo asks the trainer to drain only once its SIGUSR1 handler is in."""

from __future__ import annotations

import os
import signal

from pipeline.demo import _handles_usr1


def test_sigusr1_handler_is_seen_in_proc() -> None:
    old = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert not _handles_usr1(os.getpid(), 0.0)
        signal.signal(signal.SIGUSR1, lambda *_: None)
        assert _handles_usr1(os.getpid(), 0.0)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert not _handles_usr1(2**22 + 12345, 0.0)  # no such process: wait a while first
    assert _handles_usr1(2**22 + 12345, 31.0)
