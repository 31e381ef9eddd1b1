"""`turnstream retry`: feed samples.retry back into turns.paired to be judged again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from pipeline.broker.clients import consumer_config, flush_or_raise, producer
from pipeline.deadletters import DeadLetters
from pipeline.errors import BrokerError, EventDecodeError
from pipeline.events import RetryRecord, decode_as, encode
from pipeline.settings import Settings


@dataclass
class RetryReport:
    requeued: int = 0
    dead_lettered: int = 0


def requeue(
    settings: Settings,
    max_attempts: int = 5,
    group_id: str | None = None,
    progress: Callable[[RetryReport], None] | None = None,
) -> RetryReport:
    """Move every record now on samples.retry back to turns.paired (attempt + 1).

    A pair that already failed ``max_attempts`` times, or a record that cannot
    be decoded, goes to the dead-letter topic with the reason. Offsets are
    committed only after the re-sent records are acknowledged by Kafka.
    """
    topics = settings.topics
    group = group_id or f"{settings.topic_prefix}turnstream-retry"
    consumer = KafkaConsumer(**consumer_config(settings, group))
    out = producer(settings, max_request_size=topics.turns_paired.max_message_bytes)
    report = RetryReport()
    try:
        tps = [
            TopicPartition(topics.samples_retry.name, p)
            for p in consumer.partitions_for_topic(topics.samples_retry.name) or []
        ]
        if not tps:
            raise BrokerError(
                f"topic {topics.samples_retry.name} does not exist; run `turnstream topics apply`"
            )
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        sent: list[Any] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                for rec in records:
                    sent.append(_route(rec, out, settings, max_attempts, report))
            flush_or_raise(out, sent, "requeued pairs or dead letters")
            consumer.commit()
            if progress:
                progress(report)
    finally:
        out.close()
        consumer.close()
    return report


def _route(rec: Any, out: Any, settings: Settings, max_attempts: int, report: RetryReport) -> Any:
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
