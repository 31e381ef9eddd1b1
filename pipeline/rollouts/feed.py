"""``rollout run --topic``: tasks taken from a topic by a consumer group, each committed only
once every rollout of it has finished.

A record of ``rollout.tasks`` is one ``RolloutInput`` JSON, parsed as a task file's line is
(:func:`~pipeline.rollouts.tasks.parse_task`; the record's key is the task id when the task
names none). A record that is no task goes to the dead-letter topic with the reason and its
``topic:partition@offset``. The ``rollout run`` processes of one group share the topic's
partitions.

At-least-once: a partition's offset is committed only up to its first unfinished task
(:class:`Ledger`), and only after the dead letters sent before were delivered. A worker
killed mid-task leaves its task uncommitted, and the group member that takes the partition
next runs it again, as new sessions (its run id is its own); the killed attempt's session
is never ended, so the scoring worker's idle timeout ends it as failed and it never trains.
A task finished behind an unfinished one on its partition is run again too: a duplicate,
never a loss.

At most ``max_in_flight`` tasks are taken and unfinished; with none free the partitions are
paused and the consumer keeps polling (it stays in the group). A rebalance commits what has
finished; a partition kept goes on where it was, a partition lost has its running tasks
abandoned (its new owner runs them again). :meth:`TaskFeed.stop` (SIGTERM, Ctrl-C) takes no
more tasks and lets the running ones finish; called again it abandons them. Only finished
tasks are committed, however the feed stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.broker.bulk import batch_sender, group_consumer
from pipeline.broker.reading import log_bounds
from pipeline.errors import RolloutError
from pipeline.rollouts.stage import DeadLetterSink, RolloutStage
from pipeline.rollouts.tasks import Task, parse_task
from pipeline.settings import Settings

log = logging.getLogger(__name__)

POLL_MS = 500  # the longest a poll waits for records (and so between commits)
NAMES_KEPT = 100_000  # task ids whose times taken a feed remembers


@dataclass
class _Partition:
    next_offset: int  # past the last record taken
    unfinished: set[int] = field(default_factory=set)
    committed: int | None = None  # the last offset this feed committed

    @property
    def commit_point(self) -> int:
        return min(self.unfinished) if self.unfinished else self.next_offset


class Ledger:
    """Per partition, the offsets taken and not yet finished, and what may be committed: the
    first unfinished offset, or past the last one taken when all have finished. Pure; the
    feed writes and reads it on its event loop only."""

    def __init__(self) -> None:
        self._parts: dict[int, _Partition] = {}

    def take(self, partition: int, offset: int) -> None:
        part = self._parts.setdefault(partition, _Partition(offset + 1))
        part.next_offset = max(part.next_offset, offset + 1)
        part.unfinished.add(offset)

    def finish(self, partition: int, offset: int) -> None:
        """``offset`` is done with (a partition dropped since: nothing to do)."""
        part = self._parts.get(partition)
        if part is not None:
            part.unfinished.discard(offset)

    def to_commit(self) -> dict[int, int]:
        """Each partition's commit point, where it moved since the last :meth:`committed`."""
        return {
            p: part.commit_point
            for p, part in self._parts.items()
            if part.commit_point != part.committed
        }

    def committed(self, offsets: dict[int, int]) -> None:
        for partition, offset in offsets.items():
            if partition in self._parts:
                self._parts[partition].committed = offset

    def position(self, partition: int) -> int | None:
        """Where reading ``partition`` goes on: past the last record taken (None: none)."""
        part = self._parts.get(partition)
        return part.next_offset if part is not None else None

    def drop(self, partition: int) -> None:
        """Forget ``partition`` (lost in a rebalance): its unfinished offsets are its new
        owner's."""
        self._parts.pop(partition, None)

    def partitions(self) -> set[int]:
        return set(self._parts)

    @property
    def unfinished(self) -> int:
        return sum(len(part.unfinished) for part in self._parts.values())


class RunNames:
    """The run id a task's sessions are named under: the feed's own run the first time a task
    id is taken, ``{run}.{k}`` the k-th time (a record read again after a rebalance, a task
    put on the topic twice), so two tasks never share a session. Remembers the last ``kept``
    task ids."""

    def __init__(self, run_id: str, kept: int = NAMES_KEPT) -> None:
        self.run_id = run_id
        self.kept = kept
        self._times: OrderedDict[str, int] = OrderedDict()

    def run_for(self, task_id: str) -> str:
        times = self._times.pop(task_id, 0) + 1
        self._times[task_id] = times
        if len(self._times) > self.kept:
            self._times.popitem(last=False)
        return self.run_id if times == 1 else f"{self.run_id}.{times}"


def record_source(rec: Any) -> str:
    return f"{rec.topic}:{rec.partition}@{rec.offset}"


def task_of_record(rec: Any) -> Task:
    """The task a record holds (its key the task id when the task names none, else
    ``p{partition}-{offset}``); RolloutError says what is wrong and where."""
    if not rec.value:
        raise RolloutError(f"{record_source(rec)}: an empty record, no RolloutInput")
    key = rec.key.decode("utf-8", "replace") if rec.key else f"p{rec.partition}-{rec.offset}"
    return parse_task(rec.value, record_source(rec), key)


class FeedDeadLetters(DeadLetterSink, Protocol):
    """The dead-letter sink of a feed: it must say when what it took is on the topic."""

    def flush(self) -> None: ...


@dataclass(frozen=True)
class FeedPlan:
    """Where a feed takes tasks from and how many at once (``rollout run --topic``'s options)."""

    topic: str  # the full name, prefix included
    group: str
    max_in_flight: int
    until_end: bool = False  # stop once the topic's end at the start is committed
    every_s: float = 5.0  # between progress lines


@dataclass
class FeedCounts:
    """What the feed did besides the stage's :class:`~pipeline.rollouts.stage.Progress`."""

    bad_records: int = 0  # records that were no task, dead-lettered
    abandoned: int = 0  # tasks stopped unfinished (a lost partition, a second stop)
    started: float = field(default_factory=time.monotonic)


class TaskFeed:
    """Takes tasks from a topic for a :class:`RolloutStage`, commits each once finished."""

    def __init__(
        self,
        stage: RolloutStage,
        dead: FeedDeadLetters,
        plan: FeedPlan,
        report: Callable[[str], None],
    ) -> None:
        self.stage = stage
        self.dead = dead
        self.plan = plan
        self.report = report
        self.ledger = Ledger()
        self.names = RunNames(stage.plan.run_id)
        self.counts = FeedCounts()
        # (partition, offset) -> the task running it: written by _take, _finished and
        # _abandon, read by the loop; all on the event loop, so never seen half-changed
        self._running: dict[tuple[int, int], asyncio.Task[None]] = {}
        self._stops = 0  # calls of stop(): 1 takes no more tasks, 2 abandons the running ones
        self._consumer: AIOKafkaConsumer | None = None
        self._failure: BaseException | None = None  # a task that raised: the feed stops

    def stop(self) -> None:
        """Take no more tasks (the first call), abandon the running ones (the second)."""
        self._stops += 1
        if self._stops == 1:
            self.report(
                f"stopping: no more tasks taken, {len(self._running)} running to their end "
                "(again to abandon them)"
            )
        else:
            self._abandon(set(self._running))

    async def run(self, settings: Settings) -> None:
        """Take, run and commit tasks until stopped (or, ``until_end``, the start's end)."""
        listener = _Rebalance(self)
        async with group_consumer(settings, self.plan.group, self.plan.topic, listener) as c:
            self._consumer = c
            ends = await self._ends(c)
            ticker = asyncio.ensure_future(self._tick())
            try:
                await self._loop(c, ends if self.plan.until_end else None)
            finally:
                ticker.cancel()
                self._abandon(set(self._running))
            await self._commit()
        if self._failure is not None:
            raise RolloutError(f"a task stopped the feed: {self._failure!r}") from self._failure

    async def _loop(
        self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int] | None
    ) -> None:
        reached = False
        while self._failure is None:
            taking = not self._stops and not reached
            if not taking and not self._running:
                return
            await self._poll(consumer, taking)
            await self._commit()
            if taking and ends is not None and not self._running:
                reached = await self._reached(consumer, ends)

    async def _ends(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
        """The end now of each partition that holds records (retention may have emptied one)."""
        tps, firsts, ends = await log_bounds(consumer, self.plan.topic)
        return {tp: ends[tp] for tp in tps if ends[tp] > firsts[tp]}

    async def _reached(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
        """Whether the group has committed every partition up to its end at the start."""
        for tp, end in ends.items():
            if ((await consumer.committed(tp)) or 0) < end:
                return False
        return True

    async def _poll(self, consumer: AIOKafkaConsumer, taking: bool) -> None:
        """Take what arrived, up to the free places; with none, poll paused (stay in the group)."""
        free = self.plan.max_in_flight - len(self._running) if taking else 0
        owned = consumer.assignment()
        if free > 0:
            consumer.resume(*owned)
        else:
            consumer.pause(*owned)
        fetched = await consumer.getmany(timeout_ms=POLL_MS, max_records=max(free, 1))
        for tp, records in fetched.items():
            for rec in records:
                if self._stops or len(self._running) >= self.plan.max_in_flight:
                    if tp in consumer.assignment():  # read again later, here or by its next owner
                        consumer.seek(tp, rec.offset)
                    break
                self._take(rec)

    def _take(self, rec: Any) -> None:
        key = (rec.partition, rec.offset)
        self.ledger.take(*key)
        try:
            task = task_of_record(rec)
        except RolloutError as exc:
            self.counts.bad_records += 1
            self.dead.dead_letter_raw("rollout", str(exc), record_source(rec), rec.value or b"")
            self.ledger.finish(*key)
            return
        task = replace(task, run_id=self.names.run_for(task.task_id))
        self.stage.progress.tasks += 1
        job = asyncio.ensure_future(self._run_task(key, task))
        self._running[key] = job
        job.add_done_callback(lambda done: self._finished(key, done))

    async def _run_task(self, key: tuple[int, int], task: Task) -> None:
        await self.stage.run_task(task)
        self.ledger.finish(*key)

    def _finished(self, key: tuple[int, int], job: asyncio.Task[None]) -> None:
        if self._running.get(key) is job:
            del self._running[key]
        if not job.cancelled() and job.exception() is not None and self._failure is None:
            self._failure = job.exception()

    def _abandon(self, keys: set[tuple[int, int]]) -> None:
        """Stop these tasks unfinished: never committed, so they are run again (their
        attempts' sessions are never ended: the idle timeout fails them)."""
        for key in keys:
            job = self._running.pop(key, None)
            if job is not None:
                job.cancel()
                self.counts.abandoned += 1

    async def _commit(self, owned: set[TopicPartition] | None = None) -> None:
        """Commit each owned partition's commit point that moved, after the dead letters."""
        consumer = self._consumer
        if consumer is None:
            return
        mine = {tp.partition for tp in (owned if owned is not None else consumer.assignment())}
        offsets = {p: o for p, o in self.ledger.to_commit().items() if p in mine}
        if not offsets:
            return
        # kafka-python's producer may be flushed from a thread while the loop sends on it
        await asyncio.to_thread(self.dead.flush)
        topic = self.plan.topic
        try:
            await consumer.commit({TopicPartition(topic, p): o for p, o in offsets.items()})
        except KafkaError as exc:
            log.warning("cannot commit %s %s now (tried again): %r", topic, offsets, exc)
            return
        self.ledger.committed(offsets)

    def _assigned(self, assigned: set[TopicPartition]) -> None:
        """After a rebalance: a partition lost has its tasks abandoned (its new owner runs
        them again), a partition kept is read on from where this feed was."""
        kept = {tp.partition for tp in assigned}
        lost = self.ledger.partitions() - kept
        self._abandon({key for key in self._running if key[0] in lost})
        for partition in lost:
            self.ledger.drop(partition)
        for tp in assigned:
            position = self.ledger.position(tp.partition)
            if position is not None and self._consumer is not None:
                self._consumer.seek(tp, position)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.plan.every_s)
            self.report(self.line())

    def line(self) -> str:
        return (
            f"{self.stage.progress.line()}; {len(self._running)} task(s) in flight, "
            f"{self.counts.bad_records} bad record(s), {self.counts.abandoned} abandoned"
        )

    def summary(self) -> dict[str, Any]:
        return {
            **self.stage.progress.summary(),
            "bad_records": self.counts.bad_records,
            "abandoned": self.counts.abandoned,
        }


class _Rebalance(ConsumerRebalanceListener):
    """Commits what has finished before partitions move; tells the feed what it kept."""

    def __init__(self, feed: TaskFeed) -> None:
        self.feed = feed

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.feed._commit(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.feed._assigned(set(assigned))


async def submit(settings: Settings, tasks: list[Task]) -> str:
    """Put ``tasks`` on rollout.tasks as they were read, keyed by task id; the topic's name."""
    spec = settings.topics.rollout_tasks
    async with batch_sender(settings, "rollout tasks", spec.max_message_bytes) as sender:
        for task in tasks:
            await sender.add_keyed(spec.name, task.task_id.encode(), task.raw)
    return spec.name
