"""The raw record reader: parsed records for consumers that ask, ConsumerRecords for others."""

from __future__ import annotations

import pytest
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord, TopicPartition

from pipeline.broker import raw_records
from pipeline.errors import ConfigError
from tests.conftest import raw_records_undone

TP = TopicPartition("t", 3)


def fetched_partition(key_deserializer: object) -> list:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, timestamp=1000, key=b"k0", value=b"v0", headers=[("h", b"1")])
    builder.append(1, timestamp=1001, key=None, value=None, headers=[])
    builder.append(2, timestamp=1002, key=b"k2", value=b"v2", headers=[])
    records = MemoryRecords(bytes(builder.build()))
    # fetched from offset 1: the record before it is skipped, as aiokafka does
    part = fetcher.PartitionRecords(TP, records, [], 1, key_deserializer, None, False, 0)
    return list(part)


def test_a_raw_consumer_gets_the_parsed_records_and_others_consumer_records() -> None:
    raw_records.install()
    raw_records.install()  # once a process: a second call changes nothing
    raw = fetched_partition(raw_records.RAW)
    plain = fetched_partition(None)
    assert [type(r) for r in plain] == [ConsumerRecord, ConsumerRecord]
    assert not any(isinstance(r, ConsumerRecord) for r in raw)
    for r, p in zip(raw, plain, strict=True):
        assert (r.offset, r.timestamp, r.key, r.value, list(r.headers)) == (
            p.offset,
            p.timestamp,
            p.key,
            p.value,
            list(p.headers),
        )
    assert [r.offset for r in raw] == [1, 2]
    assert (raw[0].key, raw[0].value) == (None, None)


def test_an_untested_aiokafka_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raw_records, "_replaced", None)
    monkeypatch.setitem(raw_records.TESTED, "aiokafka", ("0.99.",))
    with pytest.raises(ConfigError, match=r"aiokafka 0\.\d+\.\d+ is installed.*raw record"):
        raw_records.install()


def test_after_a_test_aiokafka_has_its_own_fetcher_class_again() -> None:
    own = fetcher.PartitionRecords
    assert own.__module__ == "aiokafka.consumer.fetcher"  # no earlier test left ours in place
    with raw_records_undone():  # what the tests' autouse fixture does around each test
        raw_records.install()
        assert fetcher.PartitionRecords is not own and raw_records.installed()
        assert not any(isinstance(r, ConsumerRecord) for r in fetched_partition(raw_records.RAW))
    assert fetcher.PartitionRecords is own and not raw_records.installed()
    assert all(isinstance(r, ConsumerRecord) for r in fetched_partition(raw_records.RAW))
    raw_records.install()  # installs again, afresh (the fixture undoes it after this test)
    assert not any(isinstance(r, ConsumerRecord) for r in fetched_partition(raw_records.RAW))


def test_what_was_installed_before_is_left_installed() -> None:
    raw_records.install()
    ours = fetcher.PartitionRecords
    with raw_records_undone():
        raw_records.install()
    assert fetcher.PartitionRecords is ours and raw_records.installed()
