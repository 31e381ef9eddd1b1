"""Read topic positions: how many records each topic holds, and how far a group lags."""

from __future__ import annotations

from kafka import TopicPartition
from kafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaError,
    NotCoordinatorError,
)

from pipeline.broker.following import log_ends
from pipeline.errors import BrokerError
from pipeline.settings import Settings


def end_offsets(settings: Settings, topics: list[str]) -> dict[str, int]:
    """Sum over partitions of each topic's end offset (records ever written); a topic
    that does not exist holds 0."""
    totals = dict.fromkeys(topics, 0)
    for (topic, _partition), end in log_ends(settings, topics).items():
        totals[topic] += end
    return totals


def group_lag(settings: Settings, group_id: str, topics: list[str]) -> int | None:
    """Records in ``topics`` that consumer group ``group_id`` has not committed yet.

    None when the broker cannot tell right now (its group coordinator is still
    starting, for example); callers ask again.
    """
    from pipeline.broker.clients import admin_client

    try:  # a broker that is down or restarting cannot tell either
        ends = log_ends(settings, topics)
        admin = admin_client(settings)
    except (KafkaError, BrokerError):
        return None
    try:
        tps = [TopicPartition(t, p) for t, p in ends]
        committed = admin.list_group_offsets({group_id: tps}).get(group_id, {})
    except (CoordinatorNotAvailableError, NotCoordinatorError, CoordinatorLoadInProgressError):
        return None
    except KafkaError:
        return None
    finally:
        admin.close()
    return sum(
        end - (c.offset if (c := committed.get(TopicPartition(t, p))) and c.offset >= 0 else 0)
        for (t, p), end in ends.items()
    )
