"""What the scoring worker's agents share: one context object over the stages and repairs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import faust
from faust.sensors import Sensor
from faust.types import StreamT

from pipeline.broker.bulk import KeyPartitions
from pipeline.broker.clients import faust_credentials
from pipeline.deadletters import Out
from pipeline.scoring import metrics
from pipeline.scoring.faust_fixes import drain
from pipeline.scoring.faust_fixes.acks import InOrderAcks, Send, Then
from pipeline.scoring.faust_fixes.adapter import consume_in_loop, kafka_producer
from pipeline.scoring.faust_fixes.guard import OffsetGuard, Record
from pipeline.scoring.faust_fixes.handover import Handled, exit_after_refused_output
from pipeline.scoring.faust_fixes.sessions import SessionTable
from pipeline.scoring.stages import JudgeStage, PairingStage
from pipeline.settings import Settings

log = logging.getLogger(__name__)

# Events taken as one burst at most. A burst's outputs are stored, and its events
# acknowledged, together: a worker killed in between has its whole burst judged
# again by the next owner. 64 keeps that small (256-pair bursts left up to 512
# duplicates after a kill in the soak) while a burst still fills two judge requests.
BURST_MAX = 64


@dataclass
class Worker:
    """What both agents share: the stages, the session table, the outputs, the repairs."""

    settings: Settings
    app: faust.App
    turns: Any  # the chat.turns topic (the idle sweep writes session ends to it)
    pairing: PairingStage
    judging: JudgeStage
    sessions: SessionTable
    send: Send
    guard: OffsetGuard | None = None
    on_delivery_failure: Callable[[BaseException], Any] | None = None
    handled: Handled = field(default_factory=Handled)
    acks: list[InOrderAcks] = field(default_factory=list)
    stopping: list[asyncio.Future[None]] = field(default_factory=list)
    taken: int = 0  # events the agents read and have not yet handed to their ``acks``

    @property
    def in_flight(self) -> int:
        """Events the agents hold unacknowledged: read into a burst, or being handled."""
        return self.taken + sum(acks.pending for acks in self.acks)

    def took(self, events: int) -> None:
        """Count events read from a stream (negative: handed on, or dropped)."""
        self.taken += events

    def bursts(self, stream: StreamT) -> AsyncIterator[list[Any]]:
        """``stream``'s events in bursts of at most ``BURST_MAX`` (and the window), counted
        in ``in_flight``."""
        return bursts(stream, min(BURST_MAX, self.settings.scoring.window), self.took)

    async def settled(self, timeout_s: float) -> None:
        """Until nothing is in flight, or ``timeout_s`` passed."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    def undelivered(self, exc: BaseException) -> None:
        if self.on_delivery_failure is not None:
            self.on_delivery_failure(exc)
        elif not self.stopping:
            self.stopping.append(
                asyncio.ensure_future(exit_after_refused_output(self.app, self.handled, exc))
            )

    @asynccontextmanager
    async def acknowledging(
        self, stream: StreamT
    ) -> AsyncIterator[tuple[InOrderAcks, Callable[[Any], Then]]]:
        """One agent's in-order acknowledgements, running for as long as the agent does."""
        acks = InOrderAcks(self.settings.scoring.window, self.send, self.undelivered)
        self.acks.append(acks)

        def then(events: list[Any]) -> Then:
            async def ack() -> None:
                for event in events:
                    await stream.ack(event)
                    m = event.message
                    self.handled.done(m.topic, m.partition, m.offset)

            return ack

        runner = asyncio.ensure_future(acks.run())
        try:
            yield acks, then
        finally:
            runner.cancel()
            if acks.drop() and self.guard is not None:
                self.guard.reset()  # what it dropped is read back, not taken for seen

    async def records(self, events: list[Any]) -> list[Record]:
        """The records of a burst of events, each after those before it that the stream
        skipped (read back by the guard); none for an event delivered again (``seen``)."""
        records = []
        guard, again = self.guard, 0
        for event in events:
            m = event.message
            if guard is not None:
                if guard.seen(m.topic, m.partition, m.offset):
                    metrics.REDELIVERED.labels(m.topic).inc()
                    again += 1
                    continue
                records += await guard.missing(m.topic, m.partition, m.offset)
            records.append(Record(m.topic, m.partition, m.offset, event.key, event.value))
        if again:
            log.info("%d record(s) delivered again, already handled here: not handled twice", again)
        return records

    def pair_record(self, raw: bytes | None, key: bytes | None, where: str, partition: int,
                    outs: list[Out], writes: dict[tuple[int, str], Any]) -> None:  # fmt: skip
        """Pair one record: its pairs to ``outs``, its session's new state to ``writes``."""
        result = self.pairing.handle(raw, key, where, self.sessions.get)
        if result.session_id is not None:
            state = None if result.forget else result.state
            self.sessions.set(result.session_id, state)
            writes[partition, result.session_id] = state
        outs.extend(result.outs)

    def judge_records(self, records: list[Record]) -> asyncio.Future[list[Out]]:
        """Judge records at the same time (their judge calls share requests); their outputs
        in the records' order."""

        async def judge_all() -> list[Out]:
            handle = self.judging.handle
            made = await asyncio.gather(*(handle(r.value, r.key, r.where) for r in records))
            return [out for outs in made for out in outs]

        return asyncio.ensure_future(judge_all())


def faust_app(settings: Settings) -> faust.App:
    """The Faust app of a scoring worker: its group, broker, producer and commit settings."""
    s, topics = settings.scoring, settings.topics
    app = faust.App(
        settings.topic_prefix + s.group_id,
        broker=[f"kafka://{hp}" for hp in settings.bootstrap_servers.split(",")],
        broker_credentials=faust_credentials(settings), store="memory://",
        datadir=str(s.data_dir), web_enabled=False, consumer_auto_offset_reset="earliest",
        topic_partitions=topics.chat_turns.partitions, table_standby_replicas=0,
        topic_replication_factor=topics.chat_turns.replication_factor, producer_acks=-1,
        producer_max_request_size=topics.samples_scored.max_message_bytes,
        producer_linger=s.linger_ms / 1000,
        broker_commit_interval=s.commit_interval_s, broker_session_timeout=s.session_timeout_s,
        consumer_max_fetch_size=topics.samples_scored.max_message_bytes,
        stream_buffer_maxsize=max(64, s.window),
    )  # fmt: skip
    if not s.consumer_thread:
        consume_in_loop(app)
    without_event_stats(app)
    drain.install(app.consumer)
    return app


class RawSchema(faust.Schema):
    """Keys and values as the broker holds them (bytes). Faust's own decode asks the app's
    serializers for both codecs on every record; here the event is made from the record."""

    def __init__(self) -> None:
        super().__init__(key_type=bytes, value_type=bytes, key_serializer="raw",
                         value_serializer="raw")  # fmt: skip

    def compile(self, app: Any, **_options: Any) -> Any:
        create_event = app.create_event

        async def decode(message: Any, *, propagate: bool = False) -> Any:
            return create_event(message.key, message.value, message.headers, message)

        return decode


class InboundTimes(Sensor):
    """The one figure of Faust's Monitor that Faust itself reads: when each partition's
    stream last took an event (its stall check warns about a partition without one)."""

    def __init__(self, monitor: Any) -> None:
        super().__init__()
        self.times = monitor.stream_inbound_time

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        self.times[tp] = monotonic()


def without_event_stats(app: faust.App) -> None:
    """Faust's Monitor keeps statistics of every record and event (a few percent of a
    worker's CPU); the worker's metrics are its own (``metrics``). The Monitor stays for
    the calls Faust makes to it directly (end offsets, commits), and a small sensor keeps
    the inbound times Faust's stall check reads, in place of the Monitor's."""
    dependencies = app.on_init_dependencies

    def on_init_dependencies() -> Any:
        services = dependencies()
        app.sensors.remove(app.monitor)
        app.sensors.add(InboundTimes(app.monitor))
        return services

    app.on_init_dependencies = on_init_dependencies  # type: ignore[method-assign]


def kafka_sender(app: faust.App) -> Send:
    """Outputs (raw bytes) straight to the app's producer, one record batch per partition
    and call; what resolves once each batch is stored."""
    keys: list[KeyPartitions] = []

    async def send(outs: list[Out]) -> list[Any]:
        producer = kafka_producer(app)
        if not keys or keys[0].producer is not producer:  # Faust made a new one
            keys[:] = [KeyPartitions(producer)]
        partition_for = keys[0].partition_for
        batches: dict[tuple[str, int], Any] = {}
        stored = []
        for o in outs:
            partition = o.partition
            if partition is None:
                partition = await partition_for(o.topic, o.key)
            to = (o.topic, partition)
            batch = batches.get(to)
            if batch is None:
                batch = batches[to] = producer.create_batch()
            if batch.append(key=o.key, value=o.value, timestamp=None) is None:  # full
                stored.append(await _send_batch(producer, batch, *to))
                batch = batches[to] = producer.create_batch()
                batch.append(key=o.key, value=o.value, timestamp=None)
        for (topic, partition), batch in batches.items():
            stored.append(await _send_batch(producer, batch, topic, partition))
        return stored

    return send


async def _send_batch(producer: Any, batch: Any, topic: str, partition: int) -> Any:
    batch.close()
    return await producer.send_batch(batch, topic, partition=partition)


async def bursts(
    stream: StreamT, limit: int, count: Callable[[int], Any] = lambda _n: None
) -> AsyncIterator[list[Any]]:
    """The stream's events in bursts: each event with those already waiting behind it (at
    most ``limit``), so a busy agent sends, stores and acknowledges once per burst, and an
    idle one still handles each event as it comes.

    The stream is read by its own task into a small inbox. Faust's stream may drop what
    waits in its queue (a rebalance clears it) and then wait for records that only come
    once the rebalance is over, which waits for every event read to be acknowledged: a
    burst must never wait on the stream, only on the inbox.

    ``count`` is told of each event read (+1) and of each burst once the agent is done
    with it (minus its size): a rebalance waits for those too, or an event read ahead
    would be handled after its partition's position was handed over, and again by the
    partition's next owner.
    """
    waiting = stream.channel.queue  # type: ignore[attr-defined]
    inbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=limit)

    held = 0  # read, and not yet handed back through ``count``

    async def read() -> None:
        nonlocal held
        async for event in stream.events():
            held += 1
            count(1)
            await inbox.put(event)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            if inbox.empty():
                taken = asyncio.ensure_future(inbox.get())
                await asyncio.wait({taken, reader}, return_when=asyncio.FIRST_COMPLETED)
                if not taken.done():
                    taken.cancel()
                    reader.result()  # the stream ended or failed: so does the agent
                    return
                burst = [taken.result()]
            else:
                burst = [inbox.get_nowait()]
            while len(burst) < limit:
                if inbox.empty():
                    if waiting.empty():
                        break
                    await asyncio.sleep(0)  # one loop turn for the reader to take the next
                    if inbox.empty():
                        break
                burst.append(inbox.get_nowait())
            yield burst
            held -= len(burst)
            count(-len(burst))
    finally:
        reader.cancel()
        count(-held)
