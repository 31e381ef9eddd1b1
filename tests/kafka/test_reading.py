"""The one range reader on a real broker: to the end, by offsets, by time, and its errors;
and the follower of live topics."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.broker.bulk import range_consumer
from pipeline.broker.following import Follower, log_ends, log_starts
from pipeline.broker.reading import TopicRange, read_span, read_to_end, span_by_time
from pipeline.errors import BrokerError
from pipeline.settings import Settings
from tests.kafka.helpers import make_topic

BASE_MS = 1_790_000_000_000


async def fill(settings: Settings, topic: str) -> None:
    """Records v0..v9 alternating between partitions 0 and 1, record n at BASE_MS + 1000 n."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait(
                topic, b"v%d" % n, partition=n % 2, timestamp_ms=BASE_MS + 1000 * n
            )
    finally:
        await producer.stop()


def values(records: list) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, r.value) for r in records)


def test_a_topic_is_read_to_its_end_over_every_partition(settings: Settings) -> None:
    topic = make_topic(settings, "reading.end", 2)
    asyncio.run(fill(settings, topic))
    got = values(read_to_end(settings, topic, timeout_s=30))
    assert got == sorted((n % 2, n // 2, b"v%d" % n) for n in range(10))


def test_a_range_by_offsets_is_read_exactly(settings: Settings) -> None:
    topic = make_topic(settings, "reading.offsets", 2)
    asyncio.run(fill(settings, topic))
    span = TopicRange(topic, {0: (1, 3), 1: (4, 5)})  # partition 0: v2, v4; partition 1: v9
    assert values(read_span(settings, span)) == [(0, 1, b"v2"), (0, 2, b"v4"), (1, 4, b"v9")]


def test_a_range_by_time_starts_and_ends_at_the_records_of_those_times(settings: Settings) -> None:
    topic = make_topic(settings, "reading.time", 2)
    asyncio.run(fill(settings, topic))

    async def resolve() -> TopicRange:
        async with range_consumer(settings) as consumer:
            return await span_by_time(
                consumer, topic, [0, 1], since_ms=BASE_MS + 2500, until_ms=BASE_MS + 7000
            )

    span = asyncio.run(resolve())
    assert span.spans == {0: (2, 4), 1: (1, 3)}  # v3..v6: from 2.5 s to before 7 s
    assert [v for _p, _o, v in values(read_span(settings, span))] == [b"v4", b"v6", b"v3", b"v5"]
    since = read_to_end(settings, topic, timeout_s=30, since_ms=BASE_MS + 8000)
    assert values(since) == [(0, 4, b"v8"), (1, 4, b"v9")]


def test_an_empty_topic_reads_as_nothing(settings: Settings) -> None:
    topic = make_topic(settings, "reading.empty", 2)
    assert read_to_end(settings, topic, timeout_s=30) == []


def test_a_topic_that_does_not_exist_is_named_in_the_error(settings: Settings) -> None:
    missing = settings.topic_prefix + "reading.missing"
    with pytest.raises(BrokerError, match=rf"topic {missing} does not exist on .*topics apply"):
        read_to_end(settings, missing, timeout_s=30)


def test_a_range_that_cannot_finish_names_its_partition(settings: Settings) -> None:
    topic = make_topic(settings, "reading.short", 2)
    asyncio.run(fill(settings, topic))
    beyond = TopicRange(topic, {0: (0, 5), 1: (0, 9)})  # partition 1 holds only 5 records
    with pytest.raises(BrokerError, match=rf"reading {topic} stalled.*partition 1 at 5 of 9"):
        read_span(settings, beyond, stall_s=2)


def test_a_follower_reads_from_its_starts_and_says_when_it_has_caught_up(
    settings: Settings,
) -> None:
    topic = make_topic(settings, "reading.follow", 2)
    missing = settings.topic_prefix + "reading.nothing"
    asyncio.run(fill(settings, topic))
    assert log_starts(settings, [topic, missing]) == {(topic, 0): 0, (topic, 1): 0}
    assert log_ends(settings, [topic, missing]) == {(topic, 0): 5, (topic, 1): 5}
    follower = Follower(settings, [topic, missing], starts={(topic, 1): 3})
    try:
        got: list = []
        deadline = time.monotonic() + 30
        while not follower.caught_up() and time.monotonic() < deadline:
            got += follower.poll(timeout_ms=200)
        assert follower.caught_up()
        # partition 0 from its log start, partition 1 from offset 3 (v7, v9)
        assert values(got) == [(0, o, b"v%d" % (2 * o)) for o in range(5)] + [
            (1, 3, b"v7"),
            (1, 4, b"v9"),
        ]
        asyncio.run(fill(settings, topic))  # a live tail: later records arrive too
        more: list = []
        while len(more) < 10 and time.monotonic() < deadline:
            more += follower.poll(timeout_ms=200)
        assert len(more) == 10
    finally:
        follower.close()
