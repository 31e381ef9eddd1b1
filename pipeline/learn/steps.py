"""Where a trainer step's time goes, from the trainer's metrics rows (``time_s``).

A row's ``time_s`` splits the time since the trainer's previous step ended:
``wait`` (for the batch: users served, replies judged), ``train`` (the
optimizer step), ``push`` (weights saved and loaded by the servers) and
``checkpoint`` (the checkpoint, then the commit). The first step's wait also
holds the trainer's start and the first answers, so the means leave it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PARTS = ("wait", "train", "push", "checkpoint")


def step_split(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Seconds per step, part by part (mean over the steps after the first), the whole
    step, and what the pushes moved."""
    timed = [r["time_s"] for r in rows if isinstance(r.get("time_s"), dict)]
    later = timed[1:] or timed
    mean = {part: _mean([t.get(part) for t in later]) for part in PARTS}
    known = [v for v in mean.values() if v is not None]
    pushes = [r["push"] for r in rows if isinstance(r.get("push"), dict)]
    return {
        "steps": len(timed),
        "mean_s": mean,
        "step_s": round(sum(known), 3) if known else None,
        "first_wait_s": timed[0].get("wait") if timed else None,
        "pushes": {
            kind: {
                "count": sum(p.get("kind") == kind for p in pushes),
                "mean_bytes": _mean([p.get("bytes") for p in pushes if p.get("kind") == kind]),
            }
            for kind in ("full", "delta")
        },
    }


def _mean(values: Sequence[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return round(sum(numbers) / len(numbers), 3) if numbers else None
