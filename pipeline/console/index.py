"""A bounded in-memory index of scored samples per policy version (no I/O).

Per version it keeps running figures (counts, sums, a window of (score, length) for the
judge's length bias) and the ``per_version`` highest and lowest scored samples; besides
those, the ``max_samples`` most recent samples, for the session search and a sample's
page. Versions beyond the ``max_versions`` newest keep their figures and drop their
samples, so memory is bounded however long the console runs.

A sample_id seen again while its first copy is held (at-least-once delivery) is not
counted twice; one whose first copy was already let go is counted again.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from pipeline.events import Review, Sample
from pipeline.policy_records import EVALUATION, PUSH, record_kind

LENGTH_WINDOW = 256  # (score, length) pairs per version for the length bias
MAX_POLICY_RECORDS = 10_000
Version = int | None  # None: samples that carry no policy version


def version_order(version: Version) -> tuple[bool, int]:
    """Sort key: unversioned samples first, then by version."""
    return (version is not None, version or 0)


def teacher_gaps(sample: Sample) -> list[float] | None:
    """Per response token, teacher − rollout log-prob (OPD's advantage before the trainer's
    own log-probs replace the rollout's); None when the sample lacks either."""
    teacher, rollout = sample.teacher_logprobs, sample.response_logprobs
    if not teacher or not rollout or len(teacher) != len(rollout):
        return None
    return [t - r for t, r in zip(teacher, rollout, strict=True)]


def unanimous(votes: list[int | None]) -> bool | None:
    """Whether every vote is valid and the same; None with fewer than two votes."""
    if len(votes) < 2:
        return None
    return None not in votes and len(set(votes)) == 1


@dataclass
class VersionTally:
    """Running figures of one version's samples."""

    samples: int = 0
    score_sum: float = 0.0
    chars_sum: int = 0
    excluded: int = 0
    voted: int = 0  # samples with two votes or more
    unanimous: int = 0
    gap_sum: float = 0.0  # teacher − rollout, summed over tokens
    gap_tokens: int = 0
    lengths: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=LENGTH_WINDOW))

    def add(self, sample: Sample) -> None:
        self.samples += 1
        self.score_sum += sample.score
        chars = len(sample.response.content or "")
        self.chars_sum += chars
        self.excluded += sample.loss_mask == 0
        agreed = unanimous(sample.votes)
        if agreed is not None:
            self.voted += 1
            self.unanimous += agreed
        gaps = teacher_gaps(sample)
        if gaps:
            self.gap_sum += sum(gaps)
            self.gap_tokens += len(gaps)
        self.lengths.append((sample.score, chars))


class _Extremes:
    """The ``k`` highest and ``k`` lowest scored samples; a tie keeps the newer one."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.top: list[tuple[float, int, Sample]] = []  # min-heap: the lowest of the top
        self.bottom: list[tuple[float, int, Sample]] = []  # min-heap of -score

    def add(self, sample: Sample, seq: int) -> list[Sample]:
        """Offer a sample; the samples it pushed out (each may still be in the other heap)."""
        out = []
        for heap, key in ((self.top, sample.score), (self.bottom, -sample.score)):
            heapq.heappush(heap, (key, seq, sample))
            if len(heap) > self.k:
                out.append(heapq.heappop(heap)[2])
        return out

    def samples(self) -> list[Sample]:
        return [entry[2] for entry in self.top + self.bottom]


@dataclass(frozen=True)
class Snapshot:
    """What a page needs from the index, copied under its lock."""

    tallies: dict[Version, VersionTally]
    policy: dict[int, dict[str, Any]]
    held: int
    reviews: int


class ConsoleIndex:
    """Samples, policy versions and reviews as the console holds them.

    Written by the reader thread (``add_*``), read by the server's event loop (everything
    else): every method takes ``_lock``, and what leaves it is a copy or a frozen event,
    so a page never sees a half-applied record.
    """

    def __init__(self, max_samples: int = 2000, per_version: int = 50, max_versions: int = 200):
        self.max_samples, self.per_version, self.max_versions = (
            max_samples,
            per_version,
            max_versions,
        )
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._tallies: dict[Version, VersionTally] = {}
        self._extremes: dict[Version, _Extremes] = {}
        self._recent: OrderedDict[str, Sample] = OrderedDict()
        self._held: dict[str, tuple[Sample, int]] = {}  # sample_id -> (sample, holders)
        self._policy: dict[int, dict[str, Any]] = {}
        self._reviews: OrderedDict[str, Review] = OrderedDict()

    def add_sample(self, sample: Sample) -> None:
        with self._lock:
            if sample.sample_id in self._held:
                return
            version = sample.policy_version
            self._tallies.setdefault(version, VersionTally()).add(sample)
            self._hold(sample)
            self._recent[sample.sample_id] = sample
            while len(self._recent) > self.max_samples:
                self._release(self._recent.popitem(last=False)[1])
            if version not in self._extremes:
                self._extremes[version] = _Extremes(self.per_version)
                self._drop_old_versions()
            if version in self._extremes:
                self._hold(sample)
                self._hold(sample)
                for out in self._extremes[version].add(sample, next(self._seq)):
                    self._release(out)

    def _hold(self, sample: Sample) -> None:
        _, holders = self._held.get(sample.sample_id, (sample, 0))
        self._held[sample.sample_id] = (sample, holders + 1)

    def _release(self, sample: Sample) -> None:
        held, holders = self._held[sample.sample_id]
        if holders <= 1:
            del self._held[sample.sample_id]
        else:
            self._held[sample.sample_id] = (held, holders - 1)

    def _drop_old_versions(self) -> None:
        while len(self._extremes) > self.max_versions:
            oldest = min(self._extremes, key=version_order)
            for sample in self._extremes.pop(oldest).samples():
                self._release(sample)

    def add_policy_version(self, record: dict[str, Any]) -> None:
        """A policy.versions record: a push (PolicyVersion as JSON) or a held-out evaluation
        of a version (its figures join the version's record, the push's kept); one without
        a version, or of another kind, is ignored."""
        version = record.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            return
        kind = record_kind(record)
        if kind not in (PUSH, EVALUATION):
            return
        with self._lock:
            kept = self._policy.get(version, {})
            if kind == EVALUATION:
                figures = {k: v for k, v in record.items() if k.startswith("heldout_")}
                self._policy[version] = {**kept, **figures, "version": version}
            else:  # the push's fields, and any evaluation's already read
                heldout = {k: v for k, v in kept.items() if k.startswith("heldout_")}
                self._policy[version] = {**record, **heldout}
            while len(self._policy) > MAX_POLICY_RECORDS:
                del self._policy[min(self._policy)]

    def add_review(self, sample_id: str, review: Review | None) -> None:
        """The latest verdict on a sample (None: a tombstone, the review withdrawn)."""
        with self._lock:
            self._reviews.pop(sample_id, None)
            if review is not None:
                self._reviews[sample_id] = review
                while len(self._reviews) > 2 * self.max_samples:
                    self._reviews.popitem(last=False)

    def snapshot(self) -> Snapshot:
        with self._lock:
            tallies = {}
            for version, tally in self._tallies.items():
                copy = VersionTally(**{**vars(tally), "lengths": deque(tally.lengths)})
                tallies[version] = copy
            return Snapshot(tallies, dict(self._policy), len(self._held), len(self._reviews))

    def extremes(self, version: Version, n: int) -> tuple[list[Sample], list[Sample]]:
        """The ``n`` highest scored samples of ``version`` (highest first, newest first on a
        tie) and its ``n`` lowest (lowest first)."""
        with self._lock:
            kept = self._extremes.get(version)
            if kept is None:
                return [], []
            top = sorted(kept.top, key=lambda e: (e[0], e[1]), reverse=True)[:n]
            bottom = sorted(kept.bottom, key=lambda e: (e[0], e[1]), reverse=True)[:n]
            return [e[2] for e in top], [e[2] for e in bottom]

    def sample(self, sample_id: str) -> Sample | None:
        with self._lock:
            held = self._held.get(sample_id)
            return held[0] if held else None

    def by_session(self, session_id: str, limit: int = 200) -> list[Sample]:
        """The held samples of one session, in turn order."""
        with self._lock:
            found = [s for s, _ in self._held.values() if s.session_id == session_id]
        return sorted(found, key=lambda s: s.turn_index)[:limit]

    def review(self, sample_id: str) -> Review | None:
        with self._lock:
            return self._reviews.get(sample_id)

    def versions(self) -> list[Version]:
        """Every version seen, in samples or on policy.versions, oldest first."""
        with self._lock:
            seen: set[Version] = set(self._tallies) | set(self._policy)
        return sorted(seen, key=version_order)
