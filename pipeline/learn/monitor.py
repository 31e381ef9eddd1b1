"""What a live run has done so far, read from where each stage records it.

Samples and their scores from samples.scored, pushed versions from
policy.versions, training steps from the trainer's metrics log and which step
trained which sample from its ledger log.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.broker.following import Follower
from pipeline.events import Sample, decode_as
from pipeline.learn.freshness import Push
from pipeline.policy_records import PUSH, record_kind
from pipeline.rewards.stats import cohen_kappa, confusion_table
from pipeline.settings import Settings


@dataclass(frozen=True)
class ScoredTurn:
    sample_id: str
    score: float
    included: bool
    policy_version: int | None
    exclude_reason: str | None = None
    teacher: bool = False  # it carries OPD teacher log-probs


class _Lines:
    """Complete lines appended to a file since the last read (a writer may be mid-line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def new(self) -> list[bytes]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [line for line in complete.splitlines() if line.strip()]


@dataclass
class JudgeTally:
    """What the judge said over the run's judged samples (those with a next state)."""

    samples: int = 0
    votes: int = 0
    failed: int = 0  # votes without a score the judge was asked for (no \boxed{})
    backend: str = ""
    urls: list[str] = field(default_factory=list)

    def observe(self, sample: Sample) -> None:
        self.backend, self.urls = sample.judge.backend, list(sample.judge.urls)
        if not sample.votes:
            return
        self.samples += 1
        self.votes += len(sample.votes)
        self.failed += sum(1 for v in sample.votes if v is None)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "urls": self.urls,
            "samples_judged": self.samples,
            "votes": self.votes,
            "votes_per_sample": round(self.votes / self.samples, 3) if self.samples else None,
            "failed_votes": self.failed,
        }


def intent_agreement(intents: dict[str, bool], scores: dict[str, float]) -> dict[str, Any]:
    """How the judge's majority (+1, 0, -1) agrees with what each user meant by its reply
    (``intents``: sample id -> whether the answer met the user's wish, so a +1 reply),
    over the samples both know: accuracy, Cohen kappa and the confusion table."""
    ids = sorted(set(intents) & set(scores))
    labels = [1.0 if intents[i] else -1.0 for i in ids]
    judged = [scores[i] for i in ids]
    if not ids:
        return {"n": 0}
    table = confusion_table(labels, judged)
    values = sorted({*labels, *judged})
    return {
        "n": len(ids),
        "accuracy": round(sum(a == b for a, b in zip(labels, judged, strict=True)) / len(ids), 4),
        "kappa": cohen_kappa(labels, judged),
        "labels": values,
        "counts": [[table.count(g, p) for p in values] for g in values],
    }


@dataclass
class Monitor:
    """Follows the run's topics and the trainer's files; ``poll`` reads what is new."""

    settings: Settings
    metrics_path: Path
    ledger_path: Path
    scored: dict[str, ScoredTurn] = field(default_factory=dict)
    pushes: list[Push] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    trained: dict[str, int] = field(default_factory=dict)  # sample_id -> step
    judge: JudgeTally = field(default_factory=JudgeTally)

    def __post_init__(self) -> None:
        topics = self.settings.topics
        self._follower = Follower(
            self.settings, [topics.samples_scored.name, topics.policy_versions.name]
        )
        self._versions_topic = topics.policy_versions.name
        self._metrics = _Lines(self.metrics_path)
        self._ledger = _Lines(self.ledger_path)

    def poll(self) -> None:
        for record in self._follower.poll(timeout_ms=200):
            if record.topic == self._versions_topic:
                self._push(record.value)
            else:
                self._sample(record.value)
        self.steps += [orjson.loads(line) for line in self._metrics.new()]
        for line in self._ledger.new():
            step, sample_id = line.decode().split("\t", 1)
            self.trained[sample_id] = int(step)

    def _push(self, value: bytes) -> None:
        row = orjson.loads(value)
        if record_kind(row) != PUSH:  # a held-out evaluation (learn's own): not a version
            return
        self.pushes.append(Push(int(row["version"]), int(row["step"]), float(row["ts"])))

    def _sample(self, value: bytes) -> None:
        sample = decode_as(Sample, value)
        if sample.sample_id not in self.scored:  # a duplicate delivery is one judgement
            self.judge.observe(sample)
        self.scored[sample.sample_id] = ScoredTurn(
            sample.sample_id,
            sample.score,
            sample.loss_mask == 1,
            sample.policy_version,
            sample.exclude_reason,
            sample.teacher_logprobs is not None,
        )

    @property
    def version(self) -> int:
        return max((p.version for p in self.pushes), default=0)

    @property
    def pushed_step(self) -> int:
        """The trainer's step whose weights were pushed last (0: none yet)."""
        return max((p.step for p in self.pushes), default=0)

    def close(self) -> None:
        self._follower.close()  # bounded, even after a Ctrl-C inside poll()
