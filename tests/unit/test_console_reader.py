"""The console's reader: each topic's records into the index, and what it says when the
broker cannot be reached (a real client against a port nothing listens on)."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
from kafka.consumer.fetcher import ConsumerRecord

from pipeline.broker.local import free_port_pair
from pipeline.console.index import ConsoleIndex
from pipeline.console.reader import ConsoleReader
from pipeline.console.reviews import build_review
from pipeline.console.run import tokenizer_pieces
from pipeline.events import encode
from pipeline.settings import KafkaSettings, Settings
from tests.unit.test_console_index import sample


def record(topic: str, offset: int, key: bytes | None, value: bytes | None) -> ConsumerRecord:
    return ConsumerRecord(topic, 0, -1, offset, 0, 0, key, value, [], None, 0, 0, 0)


def unreachable_settings() -> Settings:
    return Settings(kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port_pair()}"))


def test_records_of_each_topic_land_in_the_index() -> None:
    index = ConsoleIndex()
    reader = ConsoleReader(unreachable_settings(), index)  # never started: apply() alone
    s = sample(4, -1.0, version=2)
    reader.apply(record(reader.samples_topic, 0, b"s1", encode(s)))
    reader.apply(record(reader.samples_topic, 1, b"s1", b'{"type": "sample"}'))
    reader.apply(record(reader.versions_topic, 0, b"policy", orjson.dumps({"version": 3})))
    reader.apply(record(reader.reviews_topic, 0, b"s1:4", encode(build_review(s, 1, "ok", 1.0))))
    assert index.sample("s1:4") == s
    assert index.versions() == [2, 3]
    review = index.review("s1:4")
    assert review is not None and review.verdict == 1
    reader.apply(record(reader.reviews_topic, 1, b"s1:4", None))  # a tombstone withdraws it
    assert index.review("s1:4") is None
    assert reader._progress.undecodable == 1  # the sample without its fields
    assert reader._progress.next_offsets == {
        (reader.samples_topic, 0): 2,
        (reader.versions_topic, 0): 1,
        (reader.reviews_topic, 0): 2,
    }


def test_the_reader_says_when_the_broker_is_unreachable() -> None:
    settings = unreachable_settings()
    reader = ConsoleReader(settings, ConsoleIndex())
    assert not reader.status.ok and "connecting" in reader.status.text
    reader.start()
    try:
        deadline = time.monotonic() + 30
        while "not reachable" not in reader.status.text:
            assert time.monotonic() < deadline, reader.status
            time.sleep(0.1)
        assert not reader.status.ok
        assert f"Kafka at {settings.bootstrap_servers} is not reachable" in reader.status.text
    finally:
        reader.stop()


def test_opd_tokens_show_as_the_policy_tokenizer_decodes_them(tiny_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(tiny_tokenizer))("thanks that worked")["input_ids"]
    pieces = tokenizer_pieces(tiny_tokenizer)(ids)
    assert len(pieces) == len(ids) >= 2
    assert "".join(pieces).replace(" ", "") == "thanksthatworked"
