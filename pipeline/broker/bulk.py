"""aiokafka clients for the bulk paths: replay, produce FILE and reads of a range; and the
consumer group of ``rollout run --topic`` (:func:`group_consumer`).

kafka-python checks and builds every record batch in Python (about 4,000
records/s on two cores); aiokafka does it in C and takes whole batches from the
caller (``create_batch``/``send_batch``), an order of magnitude faster
(benchmarks/replay.py, benchmarks/produce.py). The live producers and the SDK
stay on kafka-python (:mod:`pipeline.broker.clients`); both are built from the
same settings.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.errors import AuthenticationFailedError, KafkaError
from aiokafka.partitioner import DefaultPartitioner

from pipeline.broker import raw_records
from pipeline.broker.connection import (
    LoginRefused,
    authentication_failed,
    connection_config,
    ssl_context,
    unreachable,
)
from pipeline.broker.gzip_level import use_gzip_level
from pipeline.errors import BrokerError
from pipeline.settings import Settings

BATCH_BYTES = 512 * 1024  # below any topic's max.message.bytes default (1 MiB)
FETCH_BYTES = 8 * 1024 * 1024  # per partition and fetch
Header = tuple[str, bytes]
RETRY_BACKOFF_MS = 10
KEYS_KEPT = 100_000  # keys whose partition is remembered (murmur2 in Python is per-key work)


def aiokafka_config(settings: Settings) -> dict[str, Any]:
    """Connection and security options shared by the aiokafka clients."""
    return {**connection_config(settings), "ssl_context": ssl_context(settings)}


@asynccontextmanager
async def _started(client: Any, settings: Settings) -> AsyncIterator[Any]:
    try:
        await client.start()
    except AuthenticationFailedError as exc:
        await client.stop()
        raise authentication_failed(settings, exc) from exc
    except KafkaError as exc:
        await client.stop()
        if settings.kafka.sasl_mechanism:  # aiokafka reports a refused login as unreachable
            await asyncio.to_thread(_check_login, settings)
        raise BrokerError(f"{unreachable(settings)} ({exc!r})") from exc
    try:
        yield client
    finally:
        await client.stop()


def _check_login(settings: Settings) -> None:
    """Raise the login error when a SASL login is why Kafka could not be reached (kafka-python
    tells a refused login apart; loaded only on this failure)."""
    from pipeline.broker.clients import admin_client

    try:
        admin_client(settings, timeout_ms=5000).close()
    except LoginRefused:
        raise
    except Exception:  # unreachable for another reason: the caller says so
        return


@asynccontextmanager
async def range_consumer(
    settings: Settings,
    group_id: str | None = None,
    fetch_bytes: int = FETCH_BYTES,
    raw: bool = False,
) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer for manual assignment, fetching up to ``fetch_bytes`` a partition at once
    (the first record of a fetch comes whole, however large); commits only when told to.

    ``raw``: records come as aiokafka parsed them (:mod:`pipeline.broker.raw_records`:
    offset, timestamp, key, value, headers; no topic or partition), a quarter to a third
    cheaper to read.
    """
    if raw:
        raw_records.install()
    consumer = AIOKafkaConsumer(
        key_deserializer=raw_records.RAW if raw else None,
        **aiokafka_config(settings),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=fetch_bytes,
        fetch_max_bytes=max(fetch_bytes, 64 * 1024 * 1024),
        # the broker checked each batch's CRC when it was written; checking it again here
        # is a quarter of a range read's time (librdkafka, and so kcat, skip it by default)
        check_crcs=False,
        # a partition the client has no metadata for yet (the first offsets asked of each
        # topic) waits this long after the refresh: aiokafka's 100 ms default is most of
        # a small range's start
        retry_backoff_ms=RETRY_BACKOFF_MS,
    )
    async with _started(consumer, settings):
        yield consumer


@asynccontextmanager
async def group_consumer(
    settings: Settings, group_id: str, topic: str, listener: ConsumerRebalanceListener
) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer in ``group_id`` subscribed to ``topic``: the group's members share its
    partitions, ``listener`` hears of each rebalance, and offsets are committed only when
    told to (a partition the group never committed starts at its log start). A member that
    stops heartbeating (killed) loses its partitions after aiokafka's session timeout (10 s);
    one that stops polling for max_poll_interval (5 min) leaves the group."""
    consumer = AIOKafkaConsumer(
        **aiokafka_config(settings),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    consumer.subscribe([topic], listener=listener)
    async with _started(consumer, settings):
        yield consumer


@asynccontextmanager
async def batch_sender(
    settings: Settings, what: str, max_request_size: int, compression: str | None = None
) -> AsyncIterator[BatchSender]:
    """An idempotent, acks=all producer that sends whole batches (see :class:`BatchSender`).

    ``compression`` defaults to TURNSTREAM_PRODUCER_COMPRESSION.
    """
    codec = compression or settings.producer_compression
    use_gzip_level(settings.producer_gzip_level, "aiokafka")
    producer = AIOKafkaProducer(
        **aiokafka_config(settings),
        acks="all",
        enable_idempotence=True,
        compression_type=None if codec == "none" else codec,
        linger_ms=10,
        max_batch_size=BATCH_BYTES,
        max_request_size=max(max_request_size, BATCH_BYTES),
    )
    async with _started(producer, settings):
        sender = BatchSender(producer, what)
        yield sender
        await sender.flush()


class KeyPartitions:
    """The partition a key goes to, as kafka-python's and Java's default partitioners pick
    it (murmur2, in Python here: remembered per key), and each topic's partitions."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._partitions: dict[str, list[int]] = {}
        self._by_key: dict[tuple[str, bytes], int] = {}
        self._pick = DefaultPartitioner()

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        """The partition of ``key`` in ``topic`` (a random one for no key)."""
        found = self._by_key.get((topic, key)) if key is not None else None
        if found is None:
            parts = await self.partitions(topic)
            found = self._pick(key, parts, parts)
            if key is not None:
                if len(self._by_key) >= KEYS_KEPT:
                    self._by_key.clear()
                self._by_key[(topic, key)] = found
        return found

    async def partitions(self, topic: str) -> list[int]:
        """The partitions of an existing ``topic`` (a missing one is waited for, then refused)."""
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._partitions[topic] = sorted(await self.producer.partitions_for(topic))
        return parts


class BatchSender:
    """Records gathered into one batch per partition, each sent when full.

    Batches of a partition go out in the order they were filled (one producer,
    idempotent), so records keep their order within a partition. :meth:`flush`
    sends what is open and waits for every batch; a batch the broker refused
    is raised there, as a BrokerError naming ``what`` was sent.
    """

    def __init__(self, producer: AIOKafkaProducer, what: str) -> None:
        self._producer = producer
        self._what = what
        self._open: dict[tuple[str, int], Any] = {}
        self._in_flight: list[asyncio.Future[Any]] = []
        self.partitioner = KeyPartitions(producer)

    async def add(
        self,
        topic: str,
        partition: int,
        records: Iterable[tuple[bytes | None, bytes | None, int | None, list[Header]]],
    ) -> None:
        """Append ``(key, value, timestamp_ms, headers)`` records to ``partition``'s batch
        (``headers`` a list: aiokafka's builder takes no other sequence)."""
        where = (topic, partition)
        batch = self._open.get(where)
        if batch is None:
            batch = self._open[where] = self._producer.create_batch()
        append = batch.append
        for key, value, timestamp_ms, headers in records:
            if append(key=key, value=value, timestamp=timestamp_ms, headers=headers) is None:
                await self._send(topic, partition, batch)
                batch = self._open[where] = self._producer.create_batch()
                append = batch.append
                append(key=key, value=value, timestamp=timestamp_ms, headers=headers)

    async def add_keyed(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None = None,
        headers: list[Header] | None = None,
    ) -> None:
        """One record to the partition its key picks (see :meth:`partition_for`)."""
        partition = await self.partition_for(topic, key)
        await self.add(topic, partition, [(key, value, timestamp_ms, headers or [])])

    async def partition_for(self, topic: str, key: bytes | None) -> int:
        return await self.partitioner.partition_for(topic, key)

    async def partitions(self, topic: str) -> list[int]:
        return await self.partitioner.partitions(topic)

    async def _send(self, topic: str, partition: int, batch: Any) -> None:
        batch.close()
        self._in_flight.append(await self._producer.send_batch(batch, topic, partition=partition))
        if len(self._in_flight) >= 64:
            self._check([f for f in self._in_flight if f.done()])
            self._in_flight = [f for f in self._in_flight if not f.done()]

    async def flush(self) -> None:
        """Send every open batch and wait until all batches are acknowledged."""
        for (topic, partition), batch in list(self._open.items()):
            await self._send(topic, partition, batch)
        self._open.clear()
        if self._in_flight:
            await asyncio.wait(self._in_flight)
        done, self._in_flight = self._in_flight, []
        self._check(done)

    def _check(self, done: list[asyncio.Future[Any]]) -> None:
        failed = [f.exception() for f in done if f.exception() is not None]
        if failed:
            raise BrokerError(
                f"{len(failed)} batch(es) of {self._what} could not be delivered: {failed[0]!r}"
            )
