"""The live view of a run: what the policy is, how users like it, how training goes.

In a terminal it is a table redrawn in place; in a pipe (``turnstream learn | tee``, CI) a
live table shows nothing until it stops, so there it is a plain line every few seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pipeline.learn.report import VersionStats
from pipeline.learn.sentinels import Sentinels

PROGRESS_EVERY_S = 10.0  # a plain progress line this often when the console is no terminal


@dataclass(frozen=True)
class Snapshot:
    phase: str
    elapsed_s: float
    served_version: int
    turns: int
    turns_per_s: float
    paused: bool
    failures: int
    steps: int
    max_steps: int
    samples_trained: int
    waiting: int
    last_push_ts: float | None
    versions: list[VersionStats]
    last_reward: float | None = None  # the trainer's last step's reward mean
    sentinels: Sentinels = field(default_factory=lambda: Sentinels([], []))


def live_table(s: Snapshot, shown_versions: int = 8) -> Table:
    """One table: the run's state on top, then reward and length per recent version, the
    held-out accuracy where a version was evaluated, and any divergence, marked."""
    table = Table(title=f"turnstream learn: {s.phase} ({s.elapsed_s:.0f}s)")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("policy version served", str(s.served_version))
    users = f"{s.turns} ({s.turns_per_s:.2f}/s)" + (" paused" if s.paused else "")
    table.add_row("user turns", users)
    if s.failures:
        table.add_row("failed sessions", str(s.failures))
    table.add_row("training steps", f"{s.steps} / {s.max_steps}")
    table.add_row("samples trained", f"{s.samples_trained} ({s.waiting} waiting)")
    push = "none yet" if s.last_push_ts is None else f"{time.time() - s.last_push_ts:.0f}s ago"
    table.add_row("last push", push)
    if s.last_reward is not None:
        table.add_row("train reward mean (last step)", f"{s.last_reward:+.2f}")
    accuracy = {r.version: r.heldout_accuracy for r in s.sentinels.rows}
    for v in s.versions[-shown_versions:]:
        reward = "-" if v.reward_mean is None else f"{v.reward_mean:+.2f}"
        held = accuracy.get(v.version)
        table.add_row(
            f"v{v.version}: reward mean / words",
            f"{reward} / {v.mean_words:.1f} ({v.turns} turns)"
            + ("" if held is None else f", held-out accuracy {held:.2f}"),
        )
    for d in s.sentinels.divergence:
        table.add_row(f"[bold red]!! divergence at v{d.version}[/]", f"[bold red]{d.reason}[/]")
    return table


def progress_line(s: Snapshot) -> str:
    """The run's state on one plain line (for a console that is no terminal)."""
    reward = "-" if s.last_reward is None else f"{s.last_reward:+.3f}"
    evaluated = s.sentinels.last_accuracy
    held = "-" if evaluated is None else f"{evaluated.heldout_accuracy:.3f} (v{evaluated.version})"
    line = (
        f"{s.phase} {s.elapsed_s:.0f}s: serving v{s.served_version}, steps {s.steps}/"
        f"{s.max_steps}, turns {s.turns}" + (" (users paused)" if s.paused else "") + ", "
        f"samples trained {s.samples_trained} ({s.waiting} waiting), "
        f"reward mean {reward}, held-out accuracy {held}"
    )
    if s.failures:
        line += f", failed sessions {s.failures}"
    if s.sentinels.divergence:
        line += ", DIVERGENCE at " + ", ".join(f"v{d.version}" for d in s.sentinels.divergence)
    return line


class LiveView:
    """Shows snapshots on ``console``: a live table in a terminal, else a plain line at most
    every ``every_s`` seconds (the first at once, the last when the view closes)."""

    def __init__(
        self,
        console: Console,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.every_s, self.clock = console, every_s, clock
        self.live = Live(console=console, refresh_per_second=2) if console.is_terminal else None
        self._printed_at: float | None = None
        self._unprinted: Snapshot | None = None

    def __enter__(self) -> LiveView:
        if self.live is not None:
            self.live.start()
        return self

    def show(self, snapshot: Snapshot) -> None:
        if self.live is not None:
            self.live.update(live_table(snapshot))
            return
        now = self.clock()
        if self._printed_at is not None and now - self._printed_at < self.every_s:
            self._unprinted = snapshot
            return
        self._print(snapshot)
        self._printed_at = now

    def _print(self, snapshot: Snapshot) -> None:
        self.console.print(progress_line(snapshot), markup=False, highlight=False, soft_wrap=True)
        self._unprinted = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.live is not None:
            self.live.stop()
        elif self._unprinted is not None:
            self._print(self._unprinted)
