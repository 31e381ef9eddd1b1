"""OffsetGuard: notice records a Faust stream skipped, and read them back.

Works around: faust-streaming skipping the first record(s) of a partition
when a worker starts or a rebalance lands while its fetcher is running (the
record is read, dropped, and its offset counted as read; faust-streaming
#34, #115, #216), and dropping records it had fetched at the end of a
partition when a rebalance lands (``stranded``). Its commit then moves past
the record: a pair or a turn would be lost. Can go when those issues are
fixed in the pinned faust-streaming (the kafka tests of the scoring worker
still pass with the guard's read-backs counted at 0).

Works around, too: faust-streaming delivering a partition's records twice after
a rebalance that leaves the partition here. Its recovery resumes the stream
partitions and only then seeks them to the committed offsets
(``Recovery._resume_streams``: ``resume_partitions``, then ``perform_seek``, which
also moves the consumer's read offset back); records fetched in between reach
the agent, and come again from the commit. Seen in a join under CPU load: 51
to 105 of 600 pairs judged twice. Can go with the rest of the guard.

The guard keeps, per partition, the next offset the agent should see: the
group's committed offset (or the log start) when the partition is newly
assigned, then the last offset seen + 1 (kept across a rebalance that leaves
the partition here). When an event arrives beyond it, the records in between
are read back with a plain consumer and handed to the agent first, in order.
An event below it was seen here already (``seen``): the agent acknowledges it
after the first delivery, and handles it once. Whatever the agent drops
unhandled (it stopped or crashed) it must ``reset`` the guard for, so that its
records are read back rather than taken for seen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pipeline.errors import BrokerError
from pipeline.scoring import metrics
from pipeline.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """A record read back by the guard (what the agents need of it)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


# (topic, partition) -> the offset the group will resume from (committed, else log start)
StartOffsets = Callable[[list[tuple[str, int]]], dict[tuple[str, int], int]]
# (topic, partition, first, end) -> records with first <= offset < end
ReadRange = Callable[[str, int, int, int], list[Record]]


class OffsetGuard:
    def __init__(self, start_offsets: StartOffsets, read_range: ReadRange) -> None:
        self._start_offsets = start_offsets
        self._read_range = read_range
        self._next: dict[tuple[str, int], int] = {}
        self._starts: dict[tuple[str, int], int] | None = None
        self._generation = 0  # assignments seen: answers from before one are stale
        self._last_seen: dict[tuple[str, int], float] = {}  # monotonic time of the last record
        self._assigned_at = time.monotonic()

    def reset(self, kept: set[tuple[str, int]] | None = None) -> None:
        """Call when partitions are (re)assigned: forget every position but those of ``kept``.

        A partition this worker held before the rebalance and holds again keeps its
        position (the stream goes on from it, or re-delivers from the commit): asking
        the group's committed offset for it would find one from before the records
        this worker just handled, and read those back a second time.
        """
        kept = kept or set()
        self._next = {key: offset for key, offset in self._next.items() if key in kept}
        self._starts = None
        self._generation += 1
        self._assigned_at = time.monotonic()
        self._last_seen = {key: t for key, t in self._last_seen.items() if key in kept}

    def seen(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the agent saw this record here already (a delivery again, below the next
        offset it should see): it is handled, or being handled, and must not be again."""
        expected = self._next.get((topic, partition))
        return expected is not None and offset < expected

    async def stranded(
        self, highwaters: dict[tuple[str, int], int], idle_s: float, now: float | None = None
    ) -> dict[tuple[str, int], int]:
        """Partitions whose records stopped coming short of their end: where to seek back to.

        The skips ``missing`` repairs are noticed when a later record arrives; records
        at the end of a partition have none after them. A partition is stranded when
        the next offset the agent should see is below its high-water mark and nothing
        arrived from it for ``idle_s`` (call this only while the agents are idle).
        """
        now = time.monotonic() if now is None else now
        waiting = [
            key
            for key, end in highwaters.items()
            if now - self._last_seen.get(key, self._assigned_at) >= idle_s
        ]
        unknown = [key for key in waiting if key not in self._next]
        if unknown and (self._starts is None or any(k not in self._starts for k in unknown)):
            generation = self._generation
            starts = await asyncio.to_thread(self._start_offsets, unknown)
            if generation != self._generation:
                return {}
            self._starts = {**(self._starts or {}), **starts}
        out = {}
        for key in waiting:
            expected = self._next.get(key, (self._starts or {}).get(key))
            if expected is not None and expected < highwaters[key]:
                out[key] = expected
                self._last_seen[key] = now  # give the stream time to deliver them
        return out

    async def missing(self, topic: str, partition: int, offset: int) -> list[Record]:
        """Records of this partition before ``offset`` that the stream never delivered.

        A rebalance (``reset``) while the broker is asked makes the answer stale:
        the question is asked again for the new assignment.
        """
        key = (topic, partition)
        self._last_seen[key] = time.monotonic()
        while True:
            generation = self._generation
            expected = self._next.get(key)
            if expected is None:
                starts = self._starts
                if starts is None or key not in starts:
                    starts = await asyncio.to_thread(self._start_offsets, [key])
                    if generation != self._generation:
                        continue
                    self._starts = starts
                expected = starts.get(key)
            if expected is None or offset <= expected:
                self._next[key] = max(self._next.get(key, 0), offset + 1)
                return []
            records = await asyncio.to_thread(self._read_range, topic, partition, expected, offset)
            if generation != self._generation:
                continue
            self._next[key] = max(self._next.get(key, 0), offset + 1)  # only once they are read
            log.warning(
                "the stream skipped %s/%d offsets %d..%d; read %d record(s) back",
                topic,
                partition,
                expected,
                offset - 1,
                len(records),
            )
            metrics.SKIPPED_RECOVERED.labels(topic).inc(len(records))
            return records


def group_starts(
    settings: Settings, group_id: str, topics: Iterable[str]
) -> dict[tuple[str, int], int]:
    """Where ``group_id`` resumes on every partition of ``topics``: its committed offset,
    or the log start where it has none (or retention trimmed past it)."""
    from pipeline.broker.clients import admin_client
    from pipeline.broker.following import log_starts

    admin = admin_client(settings)
    try:
        committed = admin.list_group_offsets(group_id).get(group_id, {})
    finally:
        admin.close()
    starts = {(tp.topic, tp.partition): meta.offset for tp, meta in committed.items()}
    for key, first in log_starts(settings, topics).items():
        if starts.get(key, -1) < first:  # never committed, or trimmed by retention
            starts[key] = first
    return starts


def kafka_guard(settings: Settings, group_id: str, topics: tuple[str, ...]) -> OffsetGuard:
    """A guard that asks the broker for the group's offsets and reads with the range reader.

    The first lookup asks about all of ``topics`` (every topic the worker reads): otherwise
    the first record of each topic waits for a lookup of its own, and a starting worker
    judged nothing for about a second (benchmarks/saturation.py, 192 slots).
    """
    from pipeline.broker.reading import TopicRange, read_span

    def start_offsets(keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return group_starts(settings, group_id, {t for t, _ in keys} | set(topics))

    def read_range(topic: str, partition: int, first: int, end: int) -> list[Record]:
        span = TopicRange(topic, {partition: (first, end)})
        try:  # fail loudly: the records must not be skipped
            records = read_span(settings, span)
        except BrokerError as exc:
            raise BrokerError(
                f"could not read {topic}/{partition} offsets {first}..{end - 1} back: {exc}"
            ) from exc
        return [Record(topic, partition, r.offset, r.key, r.value) for r in records]

    return OffsetGuard(start_offsets, read_range)
