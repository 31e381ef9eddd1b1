"""The one reader of a range of a topic, and read-to-end built on it.

Replay, rescore, the trainer's ``--from-topic``, the scoring guard's read-backs
and every read of a topic to its current end go through :func:`read_range`: an
aiokafka consumer (:func:`~pipeline.broker.bulk.range_consumer`) reading a
:class:`TopicRange` in large fetches, yielding what each fetch brought cut at
the range's ends. A partition is done when the consumer's position reaches its
end (offsets without records, such as compacted ones or transaction markers,
count as read) and is paused then, so nothing past the range is fetched.

A range is half-open per partition, ``[start, end)`` in offsets; times are
epoch milliseconds, resolved with ``offsets_for_times``: a range from time T
starts at the first record whose timestamp is >= T, a range until T ends
before it. The arithmetic (:func:`clamp`, :func:`to_read`, :func:`cut`,
:func:`unfinished`) is plain functions, tested without a broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.broker.bulk import range_consumer
from pipeline.errors import BrokerError
from pipeline.settings import Settings

# partition -> records in offset order: aiokafka's ConsumerRecord, or from a raw consumer the
# records as aiokafka parsed them (pipeline.broker.raw_records), hence Any
Fetched = dict[TopicPartition, list[Any]]
STALL_S = 120.0  # a range read gives up when nothing arrives for this long
TO_END_S = 60.0  # a read to the end gives up after this long


@dataclass(frozen=True)
class TopicRange:
    topic: str
    spans: dict[int, tuple[int, int]]  # partition -> [start, end)

    @property
    def total(self) -> int:
        return sum(max(0, end - start) for start, end in self.spans.values())

    def describe(self) -> str:
        return ", ".join(f"{p}:[{s},{e})" for p, (s, e) in sorted(self.spans.items()))

    def split(self, n: int) -> list[TopicRange]:
        """Up to ``n`` ranges of about as many records each, a partition whole in one;
        partitions with nothing to read are left out."""
        shares: list[dict[int, tuple[int, int]]] = [{} for _ in range(n)]
        sizes = [0] * n
        busiest = sorted(self.spans.items(), key=lambda item: item[1][0] - item[1][1])
        for partition, (start, end) in busiest:
            if end > start:
                least = sizes.index(min(sizes))
                shares[least][partition] = (start, end)
                sizes[least] += end - start
        return [TopicRange(self.topic, spans) for spans in shares if spans]


def clamp(
    firsts: Mapping[int, int],
    ends: Mapping[int, int],
    starts: Mapping[int, int] | None = None,
    stops: Mapping[int, int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Per partition, ``[start, stop)`` kept within the log, ``[first, end)``: a start
    before the log start (trimmed by retention) begins there, a stop past the end ends
    there, and a stop before the start is an empty span at the start."""
    starts, stops = starts or {}, stops or {}
    spans = {}
    for p, first in firsts.items():
        start, stop = starts.get(p, first), stops.get(p, ends[p])
        spans[p] = (max(start, first), min(max(stop, start), ends[p]))
    return spans


def to_read(span: TopicRange) -> dict[TopicPartition, tuple[int, int]]:
    """The partitions of ``span`` with something to read, and their ``[start, end)``."""
    return {
        TopicPartition(span.topic, p): (start, end)
        for p, (start, end) in sorted(span.spans.items())
        if end > start
    }


def cut(records: list[Any], end: int) -> list[Any]:
    """``records`` (in offset order) before offset ``end``."""
    if not records or records[-1].offset < end:
        return records
    return [r for r in records if r.offset < end]


def unfinished(positions: Mapping[Any, int], ends: Mapping[Any, int]) -> list[Any]:
    """The partitions whose position has not reached their end yet."""
    return sorted(tp for tp, end in ends.items() if positions.get(tp, 0) < end)


def describe_unfinished(positions: Mapping[Any, int], ends: Mapping[Any, int]) -> str:
    """``partition at position of end`` for each unfinished partition, for an error."""
    return ", ".join(
        f"partition {tp.partition} at {positions.get(tp, 0)} of {ends[tp]}"
        for tp in unfinished(positions, ends)
    )


class Offsets(Protocol):
    """The offset look-ups of a started consumer, as aiokafka's consumer has them."""

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]: ...

    async def offsets_for_times(self, stamps: dict[TopicPartition, int]) -> dict[Any, Any]: ...


async def at_time(
    consumer: Offsets, tps: list[TopicPartition], ms: int, ends: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """Per partition, the offset of the first record at or after ``ms`` (none: its end)."""
    found = await consumer.offsets_for_times({tp: ms for tp in tps})
    return {tp: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in tps}


async def span_by_time(
    consumer: Offsets,
    topic: str,
    partitions: Iterable[int],
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> TopicRange:
    """``partitions`` of ``topic`` from the first record at or after ``since_ms`` (None:
    the log start) to before the first at or after ``until_ms`` (None: the end now)."""
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    starts = await at_time(consumer, tps, since_ms, ends) if since_ms is not None else firsts
    stops = await at_time(consumer, tps, until_ms, ends) if until_ms is not None else ends
    spans = clamp(
        {tp.partition: firsts[tp] for tp in tps},
        {tp.partition: ends[tp] for tp in tps},
        {tp.partition: starts[tp] for tp in tps},
        {tp.partition: stops[tp] for tp in tps},
    )
    return TopicRange(topic, spans)


async def partitions_of(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The partitions of ``topic`` as the broker has them now (none: no such topic).

    A started aiokafka consumer knows only the topics of its last metadata refresh (a topic
    created since is missing for up to five minutes), so this asks the broker: the request
    aiokafka's public ``topics()`` makes, keeping the partitions it drops.
    """
    cluster = await consumer._client.fetch_all_metadata()
    return set(cluster.partitions_for_topic(topic) or ())


async def log_bounds(
    consumer: AIOKafkaConsumer, topic: str
) -> tuple[list[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int]]:
    """``topic``'s partitions, each one's log start and its end now; a topic that does not
    exist is a BrokerError that says how to make it."""
    parts = sorted(await partitions_of(consumer, topic))
    if not parts:
        raise BrokerError(f"topic {topic} does not exist; run `turnstream topics apply`")
    tps = [TopicPartition(topic, p) for p in parts]
    return tps, await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)


async def read_range(
    consumer: AIOKafkaConsumer,
    span: TopicRange,
    max_records: int = 20_000,
    stall_s: float = STALL_S,
    timeout_s: float | None = None,
) -> AsyncIterator[Fetched]:
    """The records of ``span`` (assigned to ``consumer``, an aiokafka consumer, here),
    fetch by fetch.

    Raises BrokerError naming the topic and each unfinished partition when a partition
    short of its end yields nothing for ``stall_s`` seconds, or when the range is not read
    within ``timeout_s`` (None: no limit): records of a range are never skipped silently.
    """
    ends = {tp: end for tp, (_start, end) in to_read(span).items()}
    consumer.assign(list(ends))
    for tp in ends:
        consumer.seek(tp, span.spans[tp.partition][0])
    positions: dict[TopicPartition, int] = {}
    waiting = set(ends)
    began = moved = time.monotonic()
    while waiting:
        fetched = await consumer.getmany(*waiting, timeout_ms=500, max_records=max_records)
        out: Fetched = {tp: kept for tp, recs in fetched.items() if (kept := cut(recs, ends[tp]))}
        if out:
            moved = time.monotonic()
            yield out
        for tp in list(waiting):
            positions[tp] = await consumer.position(tp)
            if positions[tp] >= ends[tp]:
                waiting.discard(tp)
                consumer.pause(tp)
        now = time.monotonic()
        if waiting and now - moved > stall_s:
            raise BrokerError(
                f"reading {span.topic} stalled: nothing arrived for {stall_s:.0f}s short of the "
                f"range's end ({describe_unfinished(positions, ends)}); is the broker up and "
                "the range still within retention?"
            )
        if waiting and timeout_s is not None and now - began > timeout_s:
            raise BrokerError(
                f"reading {span.topic} did not finish within {timeout_s:.0f}s "
                f"({describe_unfinished(positions, ends)}); is the broker up?"
            )


async def _records(
    consumer: AIOKafkaConsumer, span: TopicRange, stall_s: float, timeout_s: float | None
) -> list[Any]:
    return [
        rec
        async for fetched in read_range(consumer, span, stall_s=stall_s, timeout_s=timeout_s)
        for tp in sorted(fetched)
        for rec in fetched[tp]
    ]


def read_span(settings: Settings, span: TopicRange, stall_s: float = STALL_S) -> list[Any]:
    """Every record of ``span`` in one list (a small range: the guard's read-backs)."""

    async def read() -> list[Any]:
        async with range_consumer(settings) as consumer:
            return await _records(consumer, span, stall_s, None)

    return asyncio.run(read())


async def read_to_end_async(
    settings: Settings, topic: str, timeout_s: float = TO_END_S, since_ms: int | None = None
) -> list[Any]:
    """Every record of ``topic`` from its log start (or ``since_ms``) to its end as of
    now, in offset order within each partition; BrokerError when the topic does not exist
    or is not read within ``timeout_s``."""
    async with range_consumer(settings) as consumer:
        parts = await partitions_of(consumer, topic)
        if not parts:
            raise BrokerError(
                f"topic {topic} does not exist on {settings.bootstrap_servers}; "
                "create it with `turnstream topics apply`"
            )
        span = await span_by_time(consumer, topic, parts, since_ms=since_ms)
        return await _records(consumer, span, min(STALL_S, timeout_s), timeout_s)


def read_to_end(
    settings: Settings, topic: str, timeout_s: float = TO_END_S, since_ms: int | None = None
) -> list[Any]:
    """:func:`read_to_end_async` for code without an event loop."""
    return asyncio.run(read_to_end_async(settings, topic, timeout_s, since_ms))
