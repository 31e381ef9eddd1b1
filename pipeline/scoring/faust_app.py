"""A scoring worker's Faust app: its group, broker and commit settings; records in as the
broker holds them (``RawSchema``); outputs out as whole batches (``kafka_sender``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from time import monotonic
from typing import Any

import faust
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import RecordMetadata
from faust.sensors import Monitor, Sensor
from faust.types import TP, AppT, EventT, Message, StreamT
from mode import ServiceT

from pipeline.broker.bulk import KeyPartitions
from pipeline.broker.clients import faust_credentials
from pipeline.deadletters import Out
from pipeline.scoring.faust_fixes import drain
from pipeline.scoring.faust_fixes.acks import Send
from pipeline.scoring.faust_fixes.adapter import consume_in_loop, kafka_producer
from pipeline.settings import Settings


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

    def compile(self, app: AppT, **_options: Any) -> Callable[..., Awaitable[EventT]]:
        create_event = app.create_event

        async def decode(message: Message, *, propagate: bool = False) -> EventT:
            return create_event(message.key, message.value, message.headers, message)

        return decode


class InboundTimes(Sensor):
    """The one figure of Faust's Monitor that Faust itself reads: when each partition's
    stream last took an event (its stall check warns about a partition without one)."""

    def __init__(self, monitor: Monitor) -> None:
        super().__init__()
        self.times = monitor.stream_inbound_time

    def on_stream_event_in(self, tp: TP, offset: int, stream: StreamT, event: EventT) -> None:
        self.times[tp] = monotonic()


def without_event_stats(app: faust.App) -> None:
    """Faust's Monitor keeps statistics of every record and event (a few percent of a
    worker's CPU); the worker's metrics are its own (``metrics``). The Monitor stays for
    the calls Faust makes to it directly (end offsets, commits), and a small sensor keeps
    the inbound times Faust's stall check reads, in place of the Monitor's."""
    dependencies = app.on_init_dependencies

    def on_init_dependencies() -> Iterable[ServiceT]:
        services = dependencies()
        app.sensors.remove(app.monitor)
        app.sensors.add(InboundTimes(app.monitor))
        return services

    app.on_init_dependencies = on_init_dependencies  # type: ignore[method-assign]


def kafka_sender(app: faust.App) -> Send:
    """Outputs (raw bytes) straight to the app's producer, one record batch per partition
    and call; what resolves once each batch is stored."""
    keys: list[KeyPartitions] = []

    async def send(outs: list[Out]) -> list[Awaitable[Any]]:
        producer = kafka_producer(app)
        if not keys or keys[0].producer is not producer:  # Faust made a new one
            keys[:] = [KeyPartitions(producer)]
        partition_for = keys[0].partition_for
        batches: dict[tuple[str, int], BatchBuilder] = {}
        stored: list[Awaitable[Any]] = []
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


async def _send_batch(
    producer: AIOKafkaProducer, batch: BatchBuilder, topic: str, partition: int
) -> asyncio.Future[RecordMetadata]:
    batch.close()
    return await producer.send_batch(batch, topic, partition=partition)
