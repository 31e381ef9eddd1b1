"""Where the trainer's samples come from: the live topic, or a fixed offline range.

Both read with manual partition assignment (no rebalance can move records
under a step) and keep ``positions``, the next offset to accept per
partition; a checkpoint's positions win over everything else on restart.
``LiveSource`` follows samples.scored from its group's committed offsets and
is bounded only on request (``--until-end``, SIGUSR1). ``RangeSource`` reads
exactly a :class:`TopicRange`, partition after partition in offset order, so
the same range and seed give the same batches; it reads through the shared
range reader (aiokafka) in a thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from pipeline.backoff import RetryPolicy
from pipeline.broker.bulk import range_consumer
from pipeline.broker.clients import consumer_config
from pipeline.broker.reading import TopicRange, read_range
from pipeline.errors import BrokerError
from pipeline.settings import Settings
from pipeline.training.checkpoint import commit_waiting

FETCH_RECORDS = 2_000  # records handed to the trainer at once (a few fetches wait ahead)


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

    def commit(
        self, offsets: dict[int, int], stop: Callable[[], bool], retry_policy: RetryPolicy
    ) -> None:
        commit_waiting(self.consumer, self.topic, offsets, stop, retry_policy)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()


class RangeSource:
    """Exactly ``span``, one partition at a time in offset order, under its own group.

    The records come from the shared range reader
    (:func:`~pipeline.broker.reading.read_range`, aiokafka's large fetches) in a
    background thread, a few fetches ahead of the trainer; the kafka-python
    consumer only commits the group's offsets.
    """

    bounded = True

    def __init__(
        self, settings: Settings, group: str, span: TopicRange, positions: dict[int, int]
    ) -> None:
        self.settings, self.group, self.span = settings, group, span
        self.topic = span.topic
        self.positions = dict(positions)
        self.consumer: Any = None
        self.ends = {p: end for p, (start, end) in span.spans.items() if end > start}
        self._reader: PartitionsInOrder | None = None

    def open(self) -> None:
        self.consumer, _parts = open_consumer(self.settings, self.group, self.topic)
        todo = {
            p: (self.position(p), end) for p, end in self.ends.items() if self.position(p) < end
        }
        self._reader = PartitionsInOrder(self.settings, TopicRange(self.topic, todo))

    def bound_to_current_end(self) -> None:
        """A range is bounded already."""

    def position(self, partition: int) -> int:
        """The next offset of ``partition`` to accept."""
        return self.positions.get(partition, self.span.spans[partition][0])

    def poll(self, timeout_ms: int) -> list[Any]:
        """The next records of the first unfinished partition, up to the range's end."""
        if self._reader is None:
            return []
        got = self._reader.get(timeout_ms / 1000)
        if isinstance(got, PartitionEnd):  # offsets without records (compacted) are passed too
            self.positions[got.partition] = max(self.position(got.partition), got.end)
            return []
        return got

    def passed(self, rec: Any) -> None:
        self.positions[rec.partition] = max(self.positions.get(rec.partition, 0), rec.offset + 1)

    def at_end(self) -> bool:
        return all(self.position(p) >= end for p, end in self.ends.items())

    def commit(
        self, offsets: dict[int, int], stop: Callable[[], bool], retry_policy: RetryPolicy
    ) -> None:
        commit_waiting(self.consumer, self.topic, offsets, stop, retry_policy)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self.consumer is not None:
            self.consumer.close()


@dataclass(frozen=True)
class PartitionEnd:
    """Every record of ``partition`` before ``end`` has been handed out."""

    partition: int
    end: int


class PartitionsInOrder:
    """A thread reading ``span`` partition after partition, records in offset order.

    :meth:`get` hands out one fetch's records at a time, then a
    :class:`PartitionEnd` per partition; at most ``ahead`` of them wait in the
    queue. An error of the reader (a stalled range, the broker gone) is raised
    by :meth:`get`.
    """

    def __init__(self, settings: Settings, span: TopicRange, ahead: int = 4) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._read(settings, span)), name="range-reader", daemon=True
        )
        self._thread.start()

    async def _read(self, settings: Settings, span: TopicRange) -> None:
        try:
            async with range_consumer(settings) as consumer:
                for p in sorted(span.spans):
                    one = TopicRange(span.topic, {p: span.spans[p]})
                    async for fetched in read_range(consumer, one, max_records=FETCH_RECORDS):
                        for records in fetched.values():
                            if not await self._put(records):
                                return
                    if not await self._put(PartitionEnd(p, span.spans[p][1])):
                        return
            await self._put(None)
        except Exception as exc:  # handed to the trainer's thread, raised by get()
            await self._put(exc)

    async def _put(self, item: Any) -> bool:
        """Queue ``item`` when there is room; False once closed."""
        while not self._stop.is_set():
            try:
                self._queue.put_nowait(item)
                return True
            except queue.Full:
                await asyncio.sleep(0.01)
        return False

    def get(self, timeout_s: float) -> list[Any] | PartitionEnd:
        """The next fetch's records or partition end; [] after ``timeout_s`` or at the end."""
        if self._done:
            return []
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return []
        if item is None:
            self._done = True
            return []
        if isinstance(item, Exception):
            self._done = True
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
