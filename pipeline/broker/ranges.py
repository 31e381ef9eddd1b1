"""A range of a topic, and the one reader of it: replay, rescore, training and the scoring guard.

A :class:`TopicRange` is half-open per partition, ``[start, end)`` in offsets
(``pipeline.replay.ranges`` resolves one from times or offsets).
:func:`read_range` reads it with an aiokafka consumer in large fetches, and
yields what each fetch brought, cut at the range's ends. A partition is done
when the consumer's position reaches its end (offsets without records, such as
compacted ones or transaction markers, count as read) and is paused then, so
nothing past the range is fetched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from pipeline.broker.bulk import range_consumer
from pipeline.errors import BrokerError
from pipeline.settings import Settings


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


Fetched = dict[TopicPartition, list[Any]]  # partition -> records in offset order
STALL_S = 120.0


async def read_range(
    consumer: AIOKafkaConsumer,
    span: TopicRange,
    max_records: int = 20_000,
    stall_s: float = STALL_S,
) -> AsyncIterator[Fetched]:
    """The records of ``span`` (assigned to ``consumer`` here), fetch by fetch.

    Raises BrokerError when a partition short of its end yields nothing for
    ``stall_s`` seconds: records of a range are never skipped silently.
    """
    ends = {
        TopicPartition(span.topic, p): end for p, (start, end) in span.spans.items() if end > start
    }
    consumer.assign(list(ends))
    for tp in ends:
        consumer.seek(tp, span.spans[tp.partition][0])
    waiting = set(ends)
    moved = time.monotonic()
    while waiting:
        fetched = await consumer.getmany(*waiting, timeout_ms=500, max_records=max_records)
        out: Fetched = {}
        for tp, records in fetched.items():
            end = ends[tp]
            kept = records if records[-1].offset < end else [r for r in records if r.offset < end]
            if kept:
                out[tp] = kept
        if out:
            moved = time.monotonic()
            yield out
        for tp in list(waiting):
            if await consumer.position(tp) >= ends[tp]:
                waiting.discard(tp)
                consumer.pause(tp)
        if waiting and time.monotonic() - moved > stall_s:
            late = ", ".join(f"{tp.partition}:{ends[tp]}" for tp in sorted(waiting))
            raise BrokerError(
                f"reading {span.topic} stalled: nothing arrived for {stall_s:.0f}s short of "
                f"the range's end (partition:end {late}); is the broker up and the range "
                "still within retention?"
            )


def read_span(settings: Settings, span: TopicRange, stall_s: float = STALL_S) -> list[Any]:
    """Every record of ``span`` in one list (a small range: the guard's read-backs)."""

    async def read() -> list[Any]:
        async with range_consumer(settings) as consumer:
            return [
                rec
                async for fetched in read_range(consumer, span, stall_s=stall_s)
                for records in fetched.values()
                for rec in records
            ]

    return asyncio.run(read())
