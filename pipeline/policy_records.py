"""The two kinds of record on policy.versions.

- A **push** (the trainer's ``PolicyVersion``): a new version is served, with the
  sentinels of the step that made it (train reward, length, entropy, KL).
- A held-out **evaluation** of a version (:class:`HeldoutEvaluation`, written by an
  evaluator such as `turnstream learn`): the validation signal from another source beside
  the trainer's reward, so a reward that rises while answers get worse shows on the log.

A record without ``kind`` is a push (what the trainer writes). Readers that follow the
versions served (the capture proxy, learn's monitor) skip evaluations; the console and
the proxy's Prometheus gauges show them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import orjson

PUSH = "push"
EVALUATION = "evaluation"
EVALUATION_KEY = b"evaluation"  # pushes are keyed b"policy": one partition keeps each kind ordered


def record_kind(record: Mapping[str, Any]) -> str:
    """``push`` or ``evaluation`` (a record naming another kind is neither: skip it)."""
    kind = record.get("kind", PUSH)
    return kind if isinstance(kind, str) else ""


@dataclass(frozen=True)
class HeldoutEvaluation:
    """Version ``version`` answered ``n`` held-out prompts: the share right against their
    ground truth (``heldout_accuracy``), right and short and ended by itself
    (``heldout_success``), the mean words and the share of degenerate answers."""

    version: int
    ts: float
    n: int
    heldout_accuracy: float
    heldout_success: float
    mean_words: float
    degenerate: float
    label: str  # the evaluator's name for it (learn: before, version N, after)
    kind: str = EVALUATION

    def __post_init__(self) -> None:
        if self.version < 0 or self.n <= 0:
            raise ValueError(
                f"a held-out evaluation needs a version >= 0 and n > 0 answers, got version "
                f"{self.version} and n {self.n}"
            )

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))


def decode_evaluation(record: Mapping[str, Any]) -> HeldoutEvaluation | None:
    """The evaluation in a decoded policy.versions record (None: a push, another kind, or an
    evaluation without its figures)."""
    if record_kind(record) != EVALUATION:
        return None
    try:
        return HeldoutEvaluation(
            version=int(record["version"]),
            ts=float(record["ts"]),
            n=int(record["n"]),
            heldout_accuracy=float(record["heldout_accuracy"]),
            heldout_success=float(record["heldout_success"]),
            mean_words=float(record["mean_words"]),
            degenerate=float(record["degenerate"]),
            label=str(record.get("label", "")),
        )
    except (KeyError, TypeError, ValueError):
        return None
