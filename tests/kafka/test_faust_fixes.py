"""The Faust repairs against real faust-streaming consumers on the real broker.

``pipeline.scoring.faust_fixes`` commits through Faust's private consumer
attributes and relies on Faust's rebalance signals and seeks: these tests drive
a real Faust app (in this process) through an explicit commit, an idle commit
past records Faust never delivered, a revoke, and a seek back, and read the
group's offsets with an independent client. A faust-streaming upgrade that
changes what the repairs touch fails here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import faust
import pytest
from faust.types import TP
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from pipeline.broker.clients import admin_client
from pipeline.broker.reading import read_to_end_async
from pipeline.deadletters import Out
from pipeline.scoring.bursts import bursts
from pipeline.scoring.faust_app import kafka_sender
from pipeline.scoring.faust_fixes import adapter, drain
from pipeline.scoring.faust_fixes.guard import group_starts
from pipeline.scoring.faust_fixes.handover import Handled, commit_ahead, commit_handed_over
from pipeline.settings import Settings
from tests.kafka.helpers import make_topic, spawn

RECORDS = 10  # per topic, over 2 partitions (even offsets on 0, odd on 1)


@dataclass
class Member:
    app: faust.App
    topic: str
    group: str
    seen: list[tuple[int, int]] = field(default_factory=list)
    revoked: list[set[TP]] = field(default_factory=list)


def group_offsets(settings: Settings, group: str) -> dict[int, int]:
    admin = admin_client(settings)
    try:
        committed = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in committed.items()}


async def until(what: str, check, timeout_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.fixture(params=["in-loop", "thread"])
async def member(
    settings: Settings, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Member]:
    """A running Faust app that reads a 2-partition topic, its consumer on the app's loop
    (as the worker's) or in Faust's own thread. Its own commit never runs during a test
    (an hour apart), so every offset the group has is one we committed; it acknowledges
    what it reads, so its stop does not wait for the records."""
    from kafka.admin import NewTopic

    topic, group = settings.topics.chat_turns.name, f"{settings.topic_prefix}fx-group"
    admin = admin_client(settings)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for i in range(RECORDS):
        producer.send(topic, key=b"k", value=b"%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    app = faust.App(
        group, broker=f"kafka://{settings.bootstrap_servers}", store="memory://",
        web_enabled=False, datadir=str(tmp_path / "faust"), consumer_auto_offset_reset="earliest",
        broker_session_timeout=10, broker_commit_interval=3600,
    )  # fmt: skip
    if request.param == "in-loop":
        adapter.consume_in_loop(app)
    records = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                        value_serializer="raw")  # fmt: skip
    m = Member(app, topic, group)

    @app.agent(records)
    async def read(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            m.seen.append((event.message.partition, event.message.offset))

    await app.start()
    try:
        await until("every record", lambda: len(m.seen) >= RECORDS)
        yield m
    finally:
        await app.stop()


def test_the_guards_start_offsets_cover_every_partition_of_the_topics_asked(
    settings: Settings,
) -> None:
    """One lookup answers for every partition of every topic asked: the committed offset,
    else the log start (also where retention trimmed past a commit)."""
    paired, turns = make_topic(settings, "g-paired", 2), make_topic(settings, "g-turns", 3)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for partition, n in ((0, 5), (1, 5)):
        for i in range(n):
            producer.send(turns, value=b"%d" % i, partition=partition)
    producer.flush()
    producer.close()
    group = settings.topic_prefix + "guard-group"
    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=group,
                             enable_auto_commit=False)  # fmt: skip
    consumer.commit({TopicPartition(turns, 0): OffsetAndMetadata(3, "", -1),
                     TopicPartition(turns, 1): OffsetAndMetadata(1, "", -1)})  # fmt: skip
    consumer.close()
    admin = admin_client(settings)
    try:  # retention's work, done at once: partition 1 now starts at 4, past its commit
        admin.delete_records({TopicPartition(turns, 1): 4})
    finally:
        admin.close()

    starts = group_starts(settings, group, [paired, turns])

    assert starts == {(paired, 0): 0, (paired, 1): 0, (turns, 0): 3, (turns, 1): 4, (turns, 2): 0}


async def test_the_adapter_commits_explicit_offsets_through_a_faust_consumer(
    member: Member, settings: Settings
) -> None:
    tp = TP(member.topic, 0)
    assert adapter.committed_offset(member.app.consumer, tp) == 0
    await adapter.commit(member.app.consumer, {tp: 3})
    assert adapter.committed_offset(member.app.consumer, tp) == 3  # Faust knows it too
    assert group_offsets(settings, member.group) == {0: 3}


async def test_outputs_go_out_as_batches_through_the_producer_inside_faust(
    member: Member, settings: Settings
) -> None:
    """The worker's sender hands aiokafka whole batches: keyed records land where Kafka's
    default partitioner puts them, explicit partitions are kept, order holds per partition."""
    from kafka.partitioner.default import murmur2

    topic = make_topic(settings, "outputs", 3)
    send = kafka_sender(member.app)
    outs = [Out(topic, f"s{i % 5}".encode(), b"%d" % i) for i in range(40)]
    outs += [Out(topic, b"pinned", b"p%d" % i, 2) for i in range(3)]
    stored = await send(outs)
    assert len(stored) <= 3, "one batch a partition for records this small"
    await asyncio.gather(*stored)
    records = await read_to_end_async(settings, topic)
    assert len(records) == len(outs)
    for r in records:
        if not r.value.startswith(b"p"):
            assert r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 3, r
    for p in range(3):
        values = [r.value for r in records if r.partition == p]
        expected = [o.value for o in outs if o.value in set(values)]
        assert values == expected, f"partition {p} out of order"
    assert [r.value for r in records if r.partition == 2][-3:] == [b"p0", b"p1", b"p2"]


async def test_outputs_larger_than_a_batch_are_split_and_all_stored(
    member: Member, settings: Settings
) -> None:
    topic = make_topic(settings, "big-outputs", 1)
    outs = [Out(topic, None, bytes([65 + i % 26]) * 6000, 0) for i in range(12)]
    stored = await kafka_sender(member.app)(outs)
    assert len(stored) > 1, "Faust's 16 KiB batches: 72 KB takes several"
    await asyncio.gather(*stored)
    assert [r.value for r in await read_to_end_async(settings, topic)] == [o.value for o in outs]


def plain_app(settings: Settings, tmp_path: Path, group: str, in_loop: bool = False) -> faust.App:
    """A Faust app of its own group; ``in_loop``: its consumer on its loop, as the worker's."""
    app = faust.App(
        f"{settings.topic_prefix}{group}", broker=f"kafka://{settings.bootstrap_servers}",
        store="memory://", web_enabled=False, datadir=str(tmp_path / "faust"),
        consumer_auto_offset_reset="earliest",
    )  # fmt: skip
    if in_loop:
        adapter.consume_in_loop(app)
    return app


def raw_topic(app: faust.App, topic: str):  # type: ignore[no-untyped-def]
    return app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw")  # fmt: skip


async def test_an_agent_reads_waiting_records_in_bursts(settings: Settings, tmp_path: Path) -> None:
    """Records already fetched come to the agent together (at most the limit a burst),
    in their order; a burst is yielded as soon as nothing more is waiting."""
    topic = make_topic(settings, "bursts", 1)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for i in range(50):
        producer.send(topic, value=b"%d" % i, partition=0)
    producer.flush()
    app = plain_app(settings, tmp_path, "burst-group")
    drain.install(app.consumer)  # as the worker's: a fetched batch reaches the stream at once
    records = raw_topic(app, topic)
    seen: list[list[bytes]] = []

    @app.agent(records)
    async def read(stream):  # type: ignore[no-untyped-def]
        async for events in bursts(stream, 16):
            seen.append([event.value for event in events])

    await app.start()
    try:
        await until("every record", lambda: sum(map(len, seen)) >= 50)
        producer.send(topic, value=b"late", partition=0)
        producer.flush()
        await until("the late record", lambda: seen[-1] == [b"late"])
    finally:
        producer.close()
        await app.stop()
    assert [v for burst in seen for v in burst] == [b"%d" % i for i in range(50)] + [b"late"]
    assert max(map(len, seen)) == 16 and all(len(burst) <= 16 for burst in seen), seen


async def test_a_worker_commits_past_records_faust_never_delivered(
    member: Member, settings: Settings
) -> None:
    """The guard's read-backs are acknowledged by the worker, never by Faust: only
    commit_ahead moves the group past them."""
    handled = Handled()
    handled.done(member.topic, 0, 6)  # the last record of partition 0, handled by us
    handled.done(member.topic, 1, 3)
    assigned = {(member.topic, 0), (member.topic, 1)}
    assert await commit_ahead(member.app, handled, assigned) == {
        (member.topic, 0): 7,
        (member.topic, 1): 4,
    }
    assert group_offsets(settings, member.group) == {0: 7, 1: 4}
    assert await commit_ahead(member.app, handled, assigned) == {}  # nothing behind any more


async def test_handled_positions_are_committed_when_partitions_are_revoked(
    member: Member, settings: Settings, tmp_path: Path
) -> None:
    handled = Handled()
    handled.done(member.topic, 0, 4)
    handled.done(member.topic, 1, 7)

    @member.app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def hand_over(app: faust.App, revoked: set[TP] = frozenset(), **_kw: object) -> None:
        member.revoked.append(set(revoked))
        await commit_handed_over(app, handled, revoked)

    other = spawn(
        ["tests.kafka.faust_member", settings.bootstrap_servers, member.group, member.topic,
         str(tmp_path / "other")],
        tmp_path / "other.log",
    )  # fmt: skip
    try:
        await until("a revoke", lambda: any(TP(member.topic, 0) in r for r in member.revoked))
        await until("the commit", lambda: group_offsets(settings, member.group) == {0: 5, 1: 8})
    finally:
        os.killpg(other.pid, signal.SIGTERM)
        other.wait(timeout=30)
    assert handled.positions({(member.topic, 0), (member.topic, 1)}) == {}  # handed over


async def test_the_consumer_runs_on_the_apps_loop_and_stops_alone(
    settings: Settings, tmp_path: Path
) -> None:
    """The worker's consumer: no thread of its own, records read, and its stop leaves the
    loop's other tasks running (mode's thread stop cancels every task of its loop)."""
    topic = make_topic(settings, "inloop", 2)
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for i in range(20):
        producer.send(topic, value=b"%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    app = plain_app(settings, tmp_path, "inloop-group", in_loop=True)
    records = raw_topic(app, topic)
    seen: list[bytes] = []

    @app.agent(records)
    async def read(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            seen.append(event.value)

    bystander = asyncio.ensure_future(asyncio.sleep(3600))
    threads = {t.ident for t in threading.enumerate()}
    await app.start()
    try:
        await until("every record", lambda: len(seen) >= 20)
        assert isinstance(app.consumer._thread, adapter.InLoopConsumerThread)
        started = [t.name for t in threading.enumerate() if t.ident not in threads]
        assert started == [], f"threads started by the app: {started}"
    finally:
        await app.stop()
    assert sorted(seen, key=int) == [b"%d" % i for i in range(20)]
    assert not bystander.done(), "the consumer's stop cancelled a task that was not its own"
    bystander.cancel()
    with pytest.raises(RuntimeError, match="already made"):
        adapter.consume_in_loop(app)


async def test_a_seek_back_delivers_the_records_again(member: Member) -> None:
    """What the guard's stranded-partition repair relies on: a seek by the consumer's thread."""
    before = len(member.seen)
    await adapter.seek(member.app.consumer, TP(member.topic, 1), 3)
    await until("the re-read", lambda: len(member.seen) >= before + 2)
    assert member.seen[before:] == [(1, 3), (1, 4)]


async def test_seeks_while_records_stream_in_leave_the_fetcher_running(
    member: Member, settings: Settings
) -> None:
    """Faust's own seek runs aiokafka's on the app's thread, racing the fetcher on the
    consumer's (a crash seen once, not reproducible on demand); the adapter's seek is
    queued to the consumer's thread: 150 of them while records arrive, and it still runs."""
    producer = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=1)
    stop = asyncio.Event()

    async def stream_in() -> None:
        i = 0
        while not stop.is_set():
            for _ in range(50):
                producer.send(member.topic, key=b"k", value=b"x%d" % i, partition=i % 2)
                i += 1
            await asyncio.get_running_loop().run_in_executor(None, producer.flush)

    feeding = asyncio.ensure_future(stream_in())
    try:
        for n in range(150):
            await adapter.seek(member.app.consumer, TP(member.topic, n % 2), n % 5)
            await asyncio.sleep(0.005)
            assert adapter.fetcher_crash(member.app) is None, f"after {n + 1} seeks"
    finally:
        stop.set()
        await feeding
        producer.close()
    assert adapter.fetcher_crash(member.app) is None


def test_an_untested_faust_version_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from pipeline.errors import ConfigError

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "0.17.0" if name == "faust-streaming" else real(name),
    )
    with pytest.raises(ConfigError, match=r"faust-streaming 0\.17\.0 is installed.*0\.15\.x"):
        adapter.check_versions()


async def test_the_lag_gauge_counts_what_this_worker_has_not_committed(
    member: Member, settings: Settings
) -> None:
    """The worker's lag comes from its own consumer: end of each partition minus commit."""
    from types import SimpleNamespace

    from pipeline.scoring.upkeep import consumer_lag

    worker = SimpleNamespace(settings=settings, app=member.app)
    assert consumer_lag(worker) == {"chat.turns": RECORDS, "turns.paired": 0}  # type: ignore[arg-type]
    await adapter.commit(member.app.consumer, {TP(member.topic, 0): 3})
    assert consumer_lag(worker) == {"chat.turns": RECORDS - 3, "turns.paired": 0}  # type: ignore[arg-type]
