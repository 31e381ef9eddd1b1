"""Read topic positions: how many records each topic holds."""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition

from pipeline.broker.clients import consumer_config
from pipeline.settings import Settings


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
        consumer.close()
