"""`turnstream retry`: feed samples.retry back into turns.paired to be judged again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from kafka import KafkaProducer
from kafka.producer.future import FutureRecordMetadata

from pipeline.broker.bulk import range_consumer
from pipeline.broker.clients import flush_or_raise, producer
from pipeline.broker.reading import STALL_S, TopicRange, clamp, log_bounds, read_range
from pipeline.deadletters import DeadLetters
from pipeline.errors import BrokerError, EventDecodeError
from pipeline.events import RetryRecord, decode_as, encode
from pipeline.settings import Settings

# Records re-sent, flushed and committed at a time: a requeue stopped in between sends at
# most this many again when it is run next.
STEP_RECORDS = 500


@dataclass
class RetryReport:
    requeued: int = 0
    dead_lettered: int = 0


def requeue(
    settings: Settings,
    max_attempts: int = 5,
    group_id: str | None = None,
    progress: Callable[[RetryReport], None] | None = None,
    stall_s: float = STALL_S,
    timeout_s: float | None = None,
) -> RetryReport:
    """Move every record now on samples.retry back to turns.paired (attempt + 1).

    A pair that already failed ``max_attempts`` times, or a record that cannot
    be decoded, goes to the dead-letter topic with the reason. Offsets are
    committed only after the re-sent records are acknowledged by Kafka.

    Raises BrokerError naming the topic, each partition short of its end and how far the
    requeue got when nothing arrives for ``stall_s`` seconds, or when samples.retry is not
    read within ``timeout_s`` (None: no limit); what was requeued by then is committed,
    and a rerun goes on from there.
    """
    return asyncio.run(_requeue(settings, max_attempts, group_id, progress, stall_s, timeout_s))


async def _requeue(
    settings: Settings,
    max_attempts: int,
    group_id: str | None,
    progress: Callable[[RetryReport], None] | None,
    stall_s: float,
    timeout_s: float | None,
) -> RetryReport:
    topic = settings.topics.samples_retry.name
    group = group_id or f"{settings.topic_prefix}turnstream-retry"
    out = producer(settings, max_request_size=settings.topics.turns_paired.max_message_bytes)
    report = RetryReport()
    try:
        async with range_consumer(settings, group_id=group) as consumer:
            span = await _not_requeued(consumer, topic)
            committed = RetryReport()  # the counts as of the last commit
            try:
                async for fetched in read_range(consumer, span, STEP_RECORDS, stall_s, timeout_s):
                    sent = [
                        _route(rec, out, settings, max_attempts, report)
                        for tp in sorted(fetched)
                        for rec in fetched[tp]
                    ]
                    flush_or_raise(out, sent, "requeued pairs or dead letters")
                    await consumer.commit({tp: rs[-1].offset + 1 for tp, rs in fetched.items()})
                    committed = replace(report)
                    if progress:
                        progress(report)
            except BrokerError as exc:
                raise BrokerError(
                    f"requeue of {topic} stopped: {exc} {committed.requeued} pair(s) requeued "
                    f"and {committed.dead_lettered} dead-lettered before that are committed: "
                    "run `turnstream retry` again to go on from there"
                ) from exc
    finally:
        out.close()
    return report


async def _not_requeued(consumer: AIOKafkaConsumer, topic: str) -> TopicRange:
    """Each partition of ``topic`` from the group's commit (none: the log start) to its end."""
    tps, firsts, ends = await log_bounds(consumer, topic)
    committed = {tp.partition: await consumer.committed(tp) for tp in tps}
    spans = clamp(
        {tp.partition: firsts[tp] for tp in tps},
        {tp.partition: ends[tp] for tp in tps},
        {p: offset for p, offset in committed.items() if offset is not None},
    )
    return TopicRange(topic, spans)


def _route(
    rec: ConsumerRecord[bytes, bytes],
    out: KafkaProducer,
    settings: Settings,
    max_attempts: int,
    report: RetryReport,
) -> FutureRecordMetadata:
    topics = settings.topics
    source = f"{rec.topic}/{rec.partition}/{rec.offset}"
    try:
        record = decode_as(RetryRecord, rec.value)
    except EventDecodeError as exc:
        reason = f"undecodable retry record: {exc}"
    else:
        if record.attempts < max_attempts:
            paired = record.paired.model_copy(update={"attempt": record.attempts + 1})
            report.requeued += 1
            return out.send(topics.turns_paired.name, key=paired.route_key, value=encode(paired))
        reason = (
            f"judge or reward still failing after {record.attempts} attempts "
            f"(max {max_attempts}): {record.error}"
        )
    letter = DeadLetters(topics)("retry", reason, source, rec.value)
    report.dead_lettered += 1
    return out.send(letter.topic, value=letter.value)
