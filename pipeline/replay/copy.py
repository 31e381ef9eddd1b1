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

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from kafka import KafkaConsumer, TopicPartition

from pipeline.broker.clients import consumer_config, flush_or_raise, producer
from pipeline.errors import ConfigError
from pipeline.replay.ranges import TopicRange
from pipeline.settings import Settings

REPLAY_ID = "turnstream-replay-id"
REPLAY_SOURCE = "turnstream-replay-source"
FLUSH_EVERY = 20000
SCAN_SLACK_MS = 5 * 60 * 1000


@dataclass
class ReplayReport:
    replay_id: str
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
    source: TopicRange,
    target: str,
    replay_id: str | None = None,
    progress: Callable[[ReplayReport], None] | None = None,
) -> ReplayReport:
    if source.topic == target:
        raise ConfigError("--from and --to name the same topic; replay into another topic")
    report = ReplayReport(
        replay_id or replay_id_for(source.topic, target, spans=source.describe()),
        total=source.total,
    )
    consumer = KafkaConsumer(**consumer_config(settings, group_id=None))
    try:
        target_parts = consumer.partitions_for_topic(target)
        if not target_parts:
            raise ConfigError(
                f"target topic {target} does not exist; create it first "
                "(`turnstream topics apply`, or your cluster's tooling)"
            )
        same_layout = target_parts == (consumer.partitions_for_topic(source.topic) or set())
        first_ts = _first_timestamp(consumer, source)
        scan_from = None if first_ts is None else max(0, first_ts - SCAN_SLACK_MS)
        done = _copied_sources(consumer, target, report.replay_id, scan_from)
        out = producer(  # a bulk copy: bigger batches than the live producers use
            settings, max_request_size=_max_request(settings), linger_ms=50, batch_size=512 * 1024
        )
        started = time.monotonic()
        try:
            sent: list[Any] = []
            for rec in _records(consumer, source):
                where = f"{rec.topic}/{rec.partition}/{rec.offset}"
                if where in done:
                    report.already_there += 1
                else:
                    headers = [(k, v) for k, v in rec.headers or [] if k not in _OURS]
                    headers += [
                        (REPLAY_ID, report.replay_id.encode()),
                        (REPLAY_SOURCE, where.encode()),
                    ]
                    sent.append(
                        out.send(
                            target,
                            key=rec.key,
                            value=rec.value,
                            headers=headers,
                            timestamp_ms=rec.timestamp,
                            partition=rec.partition if same_layout else None,
                        )
                    )
                    report.copied += 1
                if len(sent) >= FLUSH_EVERY:
                    flush_or_raise(out, sent, f"replayed records to {target}")
                    sent = []
                report.seconds = time.monotonic() - started
                if progress and (report.copied + report.already_there) % 500 == 0:
                    progress(report)
            flush_or_raise(out, sent, f"replayed records to {target}")
        finally:
            out.close()
        report.seconds = time.monotonic() - started
        if progress:
            progress(report)
        return report
    finally:
        consumer.close()


_OURS = {REPLAY_ID, REPLAY_SOURCE}


def _max_request(settings: Settings) -> int:
    return max(spec.max_message_bytes for spec in settings.topics)


def _records(consumer: KafkaConsumer, source: TopicRange) -> Any:
    """The records of ``source``, partition by partition spans interleaved, in offset order."""
    tps = {
        TopicPartition(source.topic, p): (start, end)
        for p, (start, end) in source.spans.items()
        if end > start
    }
    if not tps:
        return
    consumer.assign(list(tps))
    for tp, (start, _end) in tps.items():
        consumer.seek(tp, start)
    open_tps = set(tps)
    while open_tps:
        batch = consumer.poll(timeout_ms=1000, max_records=2000)
        for tp, records in batch.items():
            end = tps[tp][1]
            for rec in records:
                if rec.offset < end:
                    yield rec
        for tp in list(open_tps):
            if consumer.position(tp) >= tps[tp][1]:
                open_tps.discard(tp)
                consumer.pause(tp)


def _first_timestamp(consumer: KafkaConsumer, source: TopicRange) -> int | None:
    """The smallest timestamp among the first record of each partition's span."""
    stamps = []
    for p, (start, end) in source.spans.items():
        if end <= start:
            continue
        tp = TopicPartition(source.topic, p)
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=500, max_records=1).get(tp)
            if records:
                stamps.append(records[0].timestamp)
                break
    consumer.assign([])
    return min(stamps) if stamps else None


def _copied_sources(
    consumer: KafkaConsumer, target: str, replay_id: str, since_ms: int | None
) -> set[str]:
    """Sources already copied into ``target`` by this replay id."""
    if since_ms is None:
        return set()
    tps = [TopicPartition(target, p) for p in consumer.partitions_for_topic(target) or []]
    starts = consumer.offsets_for_times({tp: since_ms for tp in tps})
    ends = consumer.end_offsets(tps)
    spans = {
        tp.partition: (starts[tp].offset, ends[tp]) for tp in tps if starts.get(tp) is not None
    }
    found: set[str] = set()
    wanted = replay_id.encode()
    for rec in _records(consumer, TopicRange(target, spans)):
        headers = dict(rec.headers or [])
        if headers.get(REPLAY_ID) == wanted and REPLAY_SOURCE in headers:
            found.add(headers[REPLAY_SOURCE].decode())
    consumer.assign([])
    return found
