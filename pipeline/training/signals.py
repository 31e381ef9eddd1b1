"""Stop and drain requests for a trainer process, installed before anything heavy loads.

SIGTERM / SIGINT ask the trainer to stop after its current step; SIGUSR1 asks it
to train what is on samples.scored at that moment and then stop. Installing the
handlers first means a signal that arrives while the model is still being built
is remembered, not fatal (SIGUSR1's default action would kill the process).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Requests:
    stop: bool = False
    drain: bool = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGUSR1, self._drain)

    def _stop(self, signum: int, _frame: object) -> None:
        log.warning("signal %d: stopping after the current step", signum)
        self.stop = True

    def _drain(self, _signum: int, _frame: object) -> None:
        log.warning("SIGUSR1: training what is on samples.scored now, then stopping")
        self.drain = True


REQUESTS = Requests()
