"""`turnstream replay`: copy a range of one topic into another, exactly once per replay id.

Keys, headers, timestamps (and partitions, when both topics have the same
count) are kept. Each copy carries two headers: ``turnstream-replay-id`` (a
hash of the source range and the target, or ``--replay-id``) and
``turnstream-replay-source`` (``topic/partition/offset``). Before copying, the
target is scanned for records of the same replay id, from five minutes before
the range's first timestamp (copies keep their source timestamps; the slack
covers producers whose clocks disagree a little), and those sources are
skipped: running the same replay again adds nothing, and an interrupted one
resumes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaConsumer

from pipeline.broker.bulk import range_consumer
from pipeline.broker.reading import TopicRange, read_range, span_by_time
from pipeline.errors import ConfigError
from pipeline.replay.ranges import RangeRequest, resolve_on
from pipeline.replay.share import (
    REPLAY_ID,
    REPLAY_SOURCE,
    Helper,
    copy_span,
    replay_clients,
)
from pipeline.settings import Settings

SPLIT_RECORDS = 20_000  # a range this large is copied by two processes (see replay)
SCAN_SLACK_MS = 5 * 60 * 1000
FIRST_FETCH_BYTES = 64 * 1024  # the first record of each partition: no need for more


@dataclass
class ReplayReport:
    replay_id: str
    span: TopicRange | None = None  # the range, once resolved
    total: int = 0
    copied: int = 0
    already_there: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.copied / self.seconds if self.seconds else 0.0


def replay_id_for(source: str, target: str, **request: str | None) -> str:
    """A stable id for a replay request: the same command line gives the same id.

    The request (not the offsets it resolves to) is hashed, so a replay without
    --until, run again later, copies only what arrived since.
    """
    spec = {"from": source, "to": target, **{k: v for k, v in request.items() if v is not None}}
    return hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def replay(
    settings: Settings,
    source: str,
    request: RangeRequest,
    target: str,
    replay_id: str | None = None,
    progress: Callable[[ReplayReport], None] | None = None,
    processes: int | None = None,
) -> ReplayReport:
    """Copy ``request``'s range of ``source`` into ``target``; ``progress`` is called with
    the report once the range is resolved (``report.span``) and after each fetch.

    ``processes`` copy the range, its partitions shared between them; by default
    two do on a machine with two cores or more, for ``SPLIT_RECORDS`` or more.
    """
    if source == target:
        raise ConfigError("--from and --to name the same topic; replay into another topic")
    report = ReplayReport(replay_id or replay_id_for(source, target, **request.options()))
    split_at = SPLIT_RECORDS if processes is None else 0
    if processes is None:
        processes = 2 if (os.cpu_count() or 1) >= 2 else 1
    # forked before any client or event loop exists; each starts its clients once ours have
    helpers = [Helper(settings, target) for _ in range(processes - 1)]
    finished = False
    try:
        asyncio.run(_replay(settings, source, request, target, report, progress, helpers, split_at))
        finished = True
    finally:
        for helper in helpers:
            helper.close(finished)
    return report


async def _replay(
    settings: Settings,
    source: str,
    request: RangeRequest,
    target: str,
    report: ReplayReport,
    progress: Callable[[ReplayReport], None] | None,
    helpers: list[Helper],
    split_at: int,
) -> None:
    async with replay_clients(settings, target) as (consumer, out):
        for helper in helpers:
            helper.start()
        topics = await consumer.topics()
        if target not in topics:
            raise ConfigError(
                f"target topic {target} does not exist; create it first "
                "(`turnstream topics apply`, or your cluster's tooling)"
            )
        source_parts = await out.partitions(source) if source in topics else None
        span = await resolve_on(settings, consumer, source, set(source_parts or ()), request)
        report.span, report.total = span, span.total
        if progress:
            progress(report)
        target_parts = await out.partitions(target)
        same_layout = target_parts == source_parts
        done = await _copied_sources(settings, consumer, span, target, target_parts, report)
        started = time.monotonic()

        def counted(copied: int, already: int) -> None:
            report.copied += copied
            report.already_there += already
            report.seconds = time.monotonic() - started
            if progress:
                progress(report)

        rid = report.replay_id
        shares = span.split(len(helpers) + 1) if span.total >= max(split_at, 1) else [span]
        mine, copies = dict(shares[0].spans), []
        for helper, share in zip(helpers, shares[1:], strict=False):
            if helper.give(share, done, same_layout, rid):
                copies.append(helper.copied(counted))
            else:  # it could not start: this process copies its share too
                mine.update(share.spans)
        own = TopicRange(span.topic, mine)
        copies.append(copy_span(consumer, out, own, target, same_layout, done, rid, counted))
        await asyncio.gather(*copies)
        await out.flush()
        counted(0, 0)


async def _first_timestamp(settings: Settings, source: TopicRange) -> int | None:
    """The smallest timestamp among the first record of each partition's span."""
    firsts = TopicRange(
        source.topic,
        {p: (start, start + 1) for p, (start, end) in source.spans.items() if end > start},
    )
    async with range_consumer(settings, fetch_bytes=FIRST_FETCH_BYTES, raw=True) as consumer:
        stamps = [
            records[0].timestamp
            async for fetched in read_range(consumer, firsts, max_records=1)
            for records in fetched.values()
        ]
    return min(stamps) if stamps else None


async def _copied_sources(
    settings: Settings,
    consumer: AIOKafkaConsumer,
    span: TopicRange,
    target: str,
    partitions: list[int],
    report: ReplayReport,
) -> set[str]:
    """Sources already copied into ``target`` by this replay id (none in an empty target)."""
    if (await span_by_time(consumer, target, partitions)).total == 0:
        return set()
    first_ts = await _first_timestamp(settings, span)
    if first_ts is None:
        return set()
    since_ms = max(0, first_ts - SCAN_SLACK_MS)
    recent = await span_by_time(consumer, target, partitions, since_ms=since_ms)
    found: set[str] = set()
    wanted = report.replay_id.encode()
    async for fetched in read_range(consumer, recent):
        for records in fetched.values():
            for rec in records:
                headers = dict(rec.headers)
                if headers.get(REPLAY_ID) == wanted and REPLAY_SOURCE in headers:
                    found.add(headers[REPLAY_SOURCE].decode())
    consumer.assign([])
    return found
