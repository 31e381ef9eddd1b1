"""The live view of a run: what the policy is, how users like it, how training goes."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.table import Table

from pipeline.learn.report import VersionStats


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


def live_table(s: Snapshot, shown_versions: int = 8) -> Table:
    """One table: the run's state on top, then reward and length per recent version."""
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
    for v in s.versions[-shown_versions:]:
        reward = "-" if v.reward_mean is None else f"{v.reward_mean:+.2f}"
        table.add_row(
            f"v{v.version}: reward mean / words",
            f"{reward} / {v.mean_words:.1f} ({v.turns} turns)",
        )
    return table
