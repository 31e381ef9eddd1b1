"""Ranges of a topic as the user asks for them: times and offsets resolved per partition.

A range is half-open per partition, ``[start, end)`` in offsets. Times are
ISO 8601 (``2026-11-30T10:00:00Z``; no zone means UTC) or epoch milliseconds,
resolved with ``offsets_for_times``: ``--since T`` starts at the first record
whose timestamp is >= T, ``--until T`` ends before the first record whose
timestamp is >= T.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from aiokafka import TopicPartition

from pipeline.broker.bulk import range_consumer
from pipeline.broker.reading import Offsets, TopicRange, at_time, clamp, partitions_of
from pipeline.errors import ConfigError
from pipeline.settings import Settings


def parse_time(value: str, option: str = "time") -> int:
    """Epoch milliseconds from ISO 8601 or a plain epoch-ms integer."""
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(
            f"{option} {value!r}: expected ISO 8601 (2026-11-30T10:00:00Z) or epoch milliseconds"
        ) from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_offsets(value: str | None, option: str) -> dict[int, int]:
    """``0:10,1:5`` -> {0: 10, 1: 5}."""
    if not value:
        return {}
    out: dict[int, int] = {}
    for part in value.split(","):
        try:
            partition, offset = part.split(":")
            out[int(partition)] = int(offset)
        except ValueError as exc:
            raise ConfigError(
                f"{option} {value!r}: expected PARTITION:OFFSET[,PARTITION:OFFSET...]"
            ) from exc
    return out


def parse_partitions(value: str | None) -> set[int] | None:
    if not value:
        return None
    try:
        return {int(p) for p in value.split(",")}
    except ValueError as exc:
        raise ConfigError(f"--partitions {value!r}: expected a comma-separated list") from exc


@dataclass(frozen=True)
class RangeRequest:
    """A range as the user asked for it (the command-line options), before resolving."""

    since: str | None = None
    until: str | None = None
    start_offsets: str | None = None
    end_offsets: str | None = None
    partitions: str | None = None

    def resolve(self, settings: Settings, topic: str) -> TopicRange:
        return resolve(settings, topic, **asdict(self))

    def options(self) -> dict[str, str | None]:
        return asdict(self)


def resolve(
    settings: Settings,
    topic: str,
    since: str | None = None,
    until: str | None = None,
    start_offsets: str | None = None,
    end_offsets: str | None = None,
    partitions: str | None = None,
) -> TopicRange:
    """The per-partition offsets of a time or offset range of ``topic``, as of now."""
    request = RangeRequest(since, until, start_offsets, end_offsets, partitions)

    async def on_a_consumer() -> TopicRange:
        async with range_consumer(settings) as consumer:
            known = await partitions_of(consumer, topic)
            return await resolve_on(settings, consumer, topic, known, request)

    return asyncio.run(on_a_consumer())


async def resolve_on(
    settings: Settings,
    consumer: Offsets,
    topic: str,
    known: set[int] | None,
    request: RangeRequest,
) -> TopicRange:
    """:func:`resolve` with a started consumer, given ``topic``'s partitions (None: no topic)."""
    if not known:
        raise ConfigError(f"topic {topic} does not exist on {settings.bootstrap_servers}")
    wanted = parse_partitions(request.partitions)
    if wanted is not None and not wanted <= known:
        raise ConfigError(f"--partitions {sorted(wanted - known)} not in {topic}")
    tps = [TopicPartition(topic, p) for p in sorted(wanted if wanted is not None else known)]
    first = await consumer.beginning_offsets(tps)
    last = await consumer.end_offsets(tps)
    starts = {tp: first[tp] for tp in tps}
    ends = {tp: last[tp] for tp in tps}
    if request.since is not None:
        starts = await at_time(consumer, tps, parse_time(request.since, "--since"), last)
    if request.until is not None:
        ends = await at_time(consumer, tps, parse_time(request.until, "--until"), last)
    for p, off in parse_offsets(request.start_offsets, "--start-offsets").items():
        starts[_tp(topic, p, tps)] = off
    for p, off in parse_offsets(request.end_offsets, "--end-offsets").items():
        ends[_tp(topic, p, tps)] = off
    spans = clamp(
        {tp.partition: first[tp] for tp in tps},
        {tp.partition: last[tp] for tp in tps},
        {tp.partition: starts[tp] for tp in tps},
        {tp.partition: ends[tp] for tp in tps},
    )
    return TopicRange(topic, spans)


def _tp(topic: str, partition: int, tps: list[TopicPartition]) -> TopicPartition:
    tp = TopicPartition(topic, partition)
    if tp not in tps:
        raise ConfigError(f"partition {partition} is not part of this range of {topic}")
    return tp
