"""Read topic positions: how many records each topic holds."""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorError,
)

from pipeline.broker.clients import consumer_config
from pipeline.errors import BrokerError
from pipeline.settings import Settings


def close_quickly(consumer: KafkaConsumer) -> None:
    """Close within 5 s: interrupted mid-request (Ctrl-C), kafka-python's close() would
    otherwise wait out its request timeout (305 s) before the caller's cleanup runs."""
    consumer.close(autocommit=False, timeout_ms=5000)


def end_offsets(settings: Settings, topics: list[str]) -> dict[str, int]:
    """Sum over partitions of each topic's end offset (records ever written)."""
    consumer = KafkaConsumer(**consumer_config(settings, group_id=None))
    try:
        totals: dict[str, int] = {}
        for topic in topics:
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in parts]
            totals[topic] = sum(consumer.end_offsets(tps).values()) if tps else 0
        return totals
    finally:
        close_quickly(consumer)


def group_lag(settings: Settings, group_id: str, topics: list[str]) -> int | None:
    """Records in ``topics`` that consumer group ``group_id`` has not committed yet.

    None when the broker cannot tell right now (its group coordinator is still
    starting, for example); callers ask again.
    """
    from pipeline.broker.clients import admin_client

    try:  # a broker that is down or restarting cannot tell either
        consumer = KafkaConsumer(**consumer_config(settings, group_id=None))
    except KafkaError:
        return None
    try:
        admin = admin_client(settings)
    except BrokerError:
        close_quickly(consumer)
        return None
    try:
        tps = [
            TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or set()
        ]
        ends = consumer.end_offsets(tps)
        try:
            committed = admin.list_group_offsets({group_id: tps}).get(group_id, {})
        except (CoordinatorNotAvailableError, NotCoordinatorError, CoordinatorLoadInProgressError):
            return None
        return sum(
            end - (committed[tp].offset if tp in committed and committed[tp].offset >= 0 else 0)
            for tp, end in ends.items()
        )
    except KafkaError:
        return None
    finally:
        admin.close()
        close_quickly(consumer)
