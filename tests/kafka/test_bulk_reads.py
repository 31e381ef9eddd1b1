"""The bulk paths' range reader: raw records (pipeline.broker.raw_records) against plain ones."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from pipeline.broker.bulk import range_consumer
from pipeline.broker.reading import TopicRange, read_range
from pipeline.settings import Settings
from tests.kafka.helpers import make_topic


async def fill(settings: Settings, topic: str) -> None:
    """Plain records, a committed and an aborted transaction (so control batches), tombstones."""
    plain = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    txn = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, transactional_id=topic + "-txn"
    )
    await plain.start()
    await txn.start()
    try:
        for i in range(30):
            headers = [("n", b"%d" % i)] * (i % 3)
            value = None if i % 10 == 9 else b"v%d" % i
            await plain.send(topic, value, key=b"k%d" % (i % 4), headers=headers, partition=i % 2)
        for commit in (True, False, True):
            async with txn.transaction() if commit else _aborted(txn):
                for i in range(5):
                    await txn.send(topic, b"t%d" % i, key=None, partition=i % 2)
        await plain.send_and_wait(topic, b"last", key=b"k", partition=0, timestamp_ms=12345)
    finally:
        await plain.stop()
        await txn.stop()


class _aborted:  # a context manager, like transaction()
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def __aenter__(self) -> None:
        await self.producer.begin_transaction()

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.abort_transaction()


async def read(settings: Settings, topic: str, raw: bool) -> dict[int, list]:
    async with range_consumer(settings, raw=raw) as consumer:
        from aiokafka import TopicPartition

        tps = [TopicPartition(topic, p) for p in (0, 1)]
        ends = await consumer.end_offsets(tps)
        span = TopicRange(topic, {tp.partition: (0, ends[tp]) for tp in tps})
        out: dict[int, list] = {0: [], 1: []}
        async for fetched in read_range(consumer, span, max_records=7):
            for tp, records in fetched.items():
                out[tp.partition] += records
        return out


def test_a_raw_reader_yields_what_a_plain_one_does(settings: Settings) -> None:
    topic = make_topic(settings, "bulk.reads", 2)
    asyncio.run(fill(settings, topic))
    raw = asyncio.run(read(settings, topic, raw=True))
    plain = asyncio.run(read(settings, topic, raw=False))
    for partition in (0, 1):
        assert all(isinstance(r, ConsumerRecord) for r in plain[partition])
        assert not any(isinstance(r, ConsumerRecord) for r in raw[partition])
        assert [
            (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in raw[partition]
        ] == [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in plain[partition]]
    # a partition: 15 plain records; of each of the three transactions (the aborted one too:
    # read uncommitted, as before) 3 on partition 0 and 2 on 1, their control batches skipped;
    # the last record on 0
    assert [len(raw[0]), len(raw[1])] == [15 + 3 * 3 + 1, 15 + 3 * 2]
    assert raw[0][-1].value == b"last" and raw[0][-1].timestamp == 12345
    assert sum(r.value is None for p in (0, 1) for r in raw[p]) == 3
