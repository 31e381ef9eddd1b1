"""Progress of long work: a live line on a terminal, a plain line every few seconds in a pipe."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


class Progress:
    """``name: done/total (rate, eta) note``: redrawn on a terminal, else logged each 5 s."""

    def __init__(
        self, name: str, total: int, log: Callable[[str], None], every_s: float = 5.0
    ) -> None:
        self.name, self.total, self.log, self.every_s = name, total, log, every_s
        self.done_count = 0
        self.started = self.last = time.monotonic()
        self.live = sys.stderr.isatty()

    def line(self, note: str = "") -> str:
        spent = time.monotonic() - self.started
        rate = self.done_count / spent if spent > 0 else 0.0
        left = (self.total - self.done_count) / rate if rate > 0 else 0.0
        bar = f"{self.name}: {self.done_count}/{self.total} ({spent:.0f} s, ~{left:.0f} s left)"
        return f"{bar} {note}".rstrip()

    def advance(self, n: int, note: str = "") -> None:
        self.done_count += n
        now = time.monotonic()
        if self.live:
            sys.stderr.write("\r" + self.line(note) + "\033[K")
            sys.stderr.flush()
        elif now - self.last >= self.every_s or self.done_count >= self.total:
            self.log(self.line(note))
            self.last = now

    def done(self) -> None:
        if self.live:
            sys.stderr.write("\n")
            sys.stderr.flush()
