"""Where the trainer's samples come from: the live topic, or a fixed offline range.

Both read with manual partition assignment (no rebalance can move records
under a step) and keep ``positions``, the next offset to accept per
partition; a checkpoint's positions win over everything else on restart.
``LiveSource`` follows samples.scored from its group's committed offsets and
is bounded only on request (``--until-end``, SIGUSR1). ``RangeSource`` reads
exactly a :class:`TopicRange`, partition after partition in offset order, so
the same range and seed give the same batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from pipeline.broker.clients import consumer_config
from pipeline.errors import BrokerError
from pipeline.replay.ranges import TopicRange
from pipeline.settings import Settings
from pipeline.training.checkpoint import commit_waiting


def open_consumer(settings: Settings, group: str, topic: str) -> tuple[KafkaConsumer, set[int]]:
    """A consumer in ``group`` (nothing assigned yet) and the topic's partitions."""
    size = settings.topics.samples_scored.max_message_bytes
    consumer = KafkaConsumer(
        **consumer_config(settings, group, max_partition_fetch_bytes=size, fetch_max_bytes=size * 4)
    )
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        consumer.close()
        raise BrokerError(f"topic {topic} does not exist; run `turnstream topics apply`")
    return consumer, set(parts)


class LiveSource:
    """Every partition of samples.scored, from the checkpoint, the group's commit, or the start."""

    def __init__(self, settings: Settings, group: str, positions: dict[int, int]) -> None:
        self.settings, self.group = settings, group
        self.topic = settings.topics.samples_scored.name
        self.positions = dict(positions)
        self.consumer: Any = None
        self.tps: list[TopicPartition] = []
        self.ends: dict[TopicPartition, int] | None = None

    def open(self) -> None:
        self.consumer, parts = open_consumer(self.settings, self.group, self.topic)
        self.tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(self.tps)
        for tp in self.tps:
            if tp.partition in self.positions:
                self.consumer.seek(tp, self.positions[tp.partition])
            elif (committed := self.consumer.committed(tp)) is not None:
                self.consumer.seek(tp, committed)
            else:
                self.consumer.seek_to_beginning(tp)

    @property
    def bounded(self) -> bool:
        return self.ends is not None

    def bound_to_current_end(self) -> None:
        """From now on, stop at what the topic holds at this moment (a drain request)."""
        if self.ends is None:
            self.ends = self.consumer.end_offsets(self.tps)

    def poll(self, timeout_ms: int) -> list[Any]:
        batches = self.consumer.poll(timeout_ms=timeout_ms)
        return [rec for records in batches.values() for rec in records]

    def passed(self, rec: Any) -> None:
        """``rec`` was accepted (trained later, or skipped): its partition moves past it."""
        self.positions[rec.partition] = max(self.positions.get(rec.partition, 0), rec.offset + 1)

    def at_end(self) -> bool:
        ends = self.ends
        return ends is not None and all(self.consumer.position(tp) >= ends[tp] for tp in self.tps)

    def commit(self, offsets: dict[int, int], stop: Callable[[], bool]) -> None:
        commit_waiting(self.consumer, self.topic, offsets, stop)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()


class RangeSource:
    """Exactly ``span``, one partition at a time in offset order, under its own group."""

    bounded = True

    def __init__(
        self, settings: Settings, group: str, span: TopicRange, positions: dict[int, int]
    ) -> None:
        self.settings, self.group, self.span = settings, group, span
        self.topic = span.topic
        self.positions = dict(positions)
        self.consumer: Any = None
        self.tps: list[TopicPartition] = []
        self.ends: dict[TopicPartition, int] = {}

    def open(self) -> None:
        self.consumer, _parts = open_consumer(self.settings, self.group, self.topic)
        spans = self.span.spans
        self.tps = [
            TopicPartition(self.topic, p) for p in sorted(spans) if spans[p][1] > spans[p][0]
        ]
        self.ends = {tp: spans[tp.partition][1] for tp in self.tps}
        self.consumer.assign(self.tps)
        for tp in self.tps:
            self.consumer.seek(tp, self.positions.get(tp.partition, spans[tp.partition][0]))

    def bound_to_current_end(self) -> None:
        """A range is bounded already."""

    def position(self, tp: TopicPartition) -> int:
        """The next offset to accept (the fetch position can run past the range's end)."""
        return self.positions.get(tp.partition, self.span.spans[tp.partition][0])

    def poll(self, timeout_ms: int) -> list[Any]:
        """Records of the first unfinished partition, up to the range's end."""
        current = next((tp for tp in self.tps if self.position(tp) < self.ends[tp]), None)
        self.consumer.pause(*[tp for tp in self.tps if tp != current])
        if current is not None:
            self.consumer.resume(current)
        out: list[Any] = []
        for tp, records in self.consumer.poll(timeout_ms=timeout_ms).items():
            out.extend(rec for rec in records if rec.offset < self.ends[tp])
        for tp in self.tps:  # offsets without records (deleted, compacted) are passed too
            if self.consumer.position(tp) >= self.ends[tp]:
                self.positions[tp.partition] = max(self.position(tp), self.ends[tp])
        return out

    def passed(self, rec: Any) -> None:
        self.positions[rec.partition] = max(self.positions.get(rec.partition, 0), rec.offset + 1)

    def at_end(self) -> bool:
        return all(self.position(tp) >= self.ends[tp] for tp in self.tps)

    def commit(self, offsets: dict[int, int], stop: Callable[[], bool]) -> None:
        commit_waiting(self.consumer, self.topic, offsets, stop)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
