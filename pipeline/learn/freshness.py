"""Freshness and staleness of a live run: the figures online RL exists for (pure functions).

Freshness of a trained sample: the time from its next-state event (the user's
reply) to the first answer served by a policy version that trained on it.
Staleness: how many versions the trainer was ahead of the version that served
the sample's turn when it trained on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.learn.users import ServedTurn


@dataclass(frozen=True)
class Push:
    """Policy version ``version`` was pushed after optimizer step ``step``, at ``ts``."""

    version: int
    step: int
    ts: float


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def first_version_with(step: int, pushes: Sequence[Push]) -> int | None:
    """The first pushed version whose weights include optimizer step ``step``."""
    after = [p.version for p in pushes if p.step >= step]
    return min(after) if after else None


def version_during(step: int, pushes: Sequence[Push]) -> int:
    """The version the trainer had published when it ran step ``step`` (0 before any push)."""
    before = [p.version for p in pushes if p.step < step]
    return max(before, default=0)


def sample_id(turn: ServedTurn) -> str:
    """Users ask one question per session: its sample is turn 0."""
    return f"{turn.session_id}:0"


@dataclass(frozen=True)
class Freshness:
    seconds: list[float]  # one per trained sample served on by a newer version
    not_yet_served: int  # trained samples no answer of a version that has them followed
    staleness: list[int]  # one per trained sample with a known serving version

    def to_json(self) -> dict[str, object]:
        def rounded(v: float | None) -> float | None:
            return None if v is None else round(v, 2)

        return {
            "samples": len(self.seconds),
            "not_yet_served": self.not_yet_served,
            "p50_s": rounded(percentile(self.seconds, 50)),
            "p95_s": rounded(percentile(self.seconds, 95)),
            "staleness_mean": rounded(
                sum(self.staleness) / len(self.staleness) if self.staleness else None
            ),
            "staleness_max": max(self.staleness, default=None),
            "staleness_histogram": {
                str(k): self.staleness.count(k) for k in sorted(set(self.staleness))
            },
        }


def measure(
    turns: Iterable[ServedTurn], trained: dict[str, int], pushes: Sequence[Push]
) -> Freshness:
    """Freshness and staleness of every trained sample (``trained``: sample_id -> step)."""
    turns = list(turns)
    served = sorted((t.served_at, t.version) for t in turns if t.version is not None)
    seconds: list[float] = []
    stale: list[int] = []
    missing = 0
    for turn in turns:
        step = trained.get(sample_id(turn))
        if step is None or turn.replied_at is None:
            continue
        if turn.version is not None:
            stale.append(version_during(step, pushes) - turn.version)
        version = first_version_with(step, pushes)
        first = next(
            (ts for ts, v in served if version is not None and v is not None and v >= version),
            None,
        )
        if first is None:
            missing += 1
        else:
            seconds.append(first - turn.replied_at)
    return Freshness(seconds, missing, stale)
