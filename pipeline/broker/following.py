"""Following topics from plain (thread) code: live tails and the ends of partitions.

A :class:`Follower` is a kafka-python consumer without a group, assigned every
partition of its topics, polled by a thread that watches a live run (the
proxy's policy versions, ``learn``'s monitor, the demo's progress); it says
when it has caught up with what the topics held when it opened. Bounded reads
of a range or to the end go through :mod:`pipeline.broker.reading` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from pipeline.broker.clients import consumer_config
from pipeline.broker.reading import unfinished
from pipeline.settings import Settings

Partition = tuple[str, int]  # (topic, partition)


def close_quickly(consumer: KafkaConsumer) -> None:
    """Close within 5 s: interrupted mid-request (Ctrl-C), kafka-python's close() would
    otherwise wait out its request timeout (305 s) before the caller's cleanup runs."""
    consumer.close(autocommit=False, timeout_ms=5000)


def partitions(consumer: KafkaConsumer, topics: Iterable[str]) -> list[TopicPartition]:
    """Every partition of ``topics`` in order; a topic that does not exist has none."""
    return [
        TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())
    ]


def log_ends(settings: Settings, topics: Iterable[str]) -> dict[Partition, int]:
    """The end offset (records ever written) of every partition of ``topics``."""
    return _bounds(settings, topics, "end_offsets")


def log_starts(settings: Settings, topics: Iterable[str]) -> dict[Partition, int]:
    """The log start offset (the first kept by retention) of every partition of ``topics``."""
    return _bounds(settings, topics, "beginning_offsets")


def _bounds(settings: Settings, topics: Iterable[str], lookup: str) -> dict[Partition, int]:
    consumer = KafkaConsumer(**consumer_config(settings, group_id=None))
    try:
        tps = partitions(consumer, topics)
        found = getattr(consumer, lookup)(tps) if tps else {}
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}
    finally:
        close_quickly(consumer)


class Follower:
    """Every partition of ``topics`` from ``starts`` (the log start where none is given),
    read by :meth:`poll`; :meth:`caught_up` once what they held at the start is read.
    ``client_options`` go to the kafka-python consumer (a shorter ``bootstrap_timeout_ms``
    than its 30 s, for a caller that says at once that the broker is unreachable).

    One thread polls it (kafka-python's consumer is not thread-safe).
    """

    def __init__(
        self,
        settings: Settings,
        topics: Iterable[str],
        starts: Mapping[Partition, int] | None = None,
        **client_options: Any,
    ) -> None:
        starts = starts or {}
        self._consumer = KafkaConsumer(**consumer_config(settings, None, **client_options))
        try:
            self.partitions = partitions(self._consumer, topics)
            self._consumer.assign(self.partitions)
            for tp in self.partitions:
                if (tp.topic, tp.partition) in starts:
                    self._consumer.seek(tp, starts[tp.topic, tp.partition])
                else:
                    self._consumer.seek_to_beginning(tp)
            self._ends = self._consumer.end_offsets(self.partitions) if self.partitions else {}
        except BaseException:
            close_quickly(self._consumer)
            raise
        self._caught_up = not self._ends

    def poll(self, timeout_ms: int) -> list[Any]:
        """The records that arrived since the last poll (waiting up to ``timeout_ms``), in
        offset order within each partition."""
        return [
            rec
            for records in self._consumer.poll(timeout_ms=timeout_ms).values()
            for rec in records
        ]

    def caught_up(self) -> bool:
        """Whether every partition's position has reached its end as of the start."""
        if not self._caught_up:
            positions = {tp: self._consumer.position(tp) for tp in self._ends}
            self._caught_up = not unfinished(positions, self._ends)
        return self._caught_up

    def close(self) -> None:
        close_quickly(self._consumer)
