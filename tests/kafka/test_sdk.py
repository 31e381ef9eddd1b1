"""TurnProducer as an application meets it: built in one call, typed helpers, flush on exit."""

from __future__ import annotations

import re

import pytest

from pipeline.errors import BrokerError, EventDecodeError
from pipeline.events import Message, SessionEnd, Turn, decode_input
from pipeline.produce import TurnProducer
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.conftest import REPO, free_port_pair
from tests.kafka.helpers import read_all


def readme_block(heading: str) -> str:
    """The first fenced python block under ``## heading`` in the README."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, f"no python block under {heading!r}"
    return found.group(1)


def test_the_readme_block_runs_as_written(
    settings: Settings, topic_prefix: str, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin.apply(settings)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("TURNSTREAM_TOPIC_PREFIX", topic_prefix)
    exec(compile(readme_block("Producing from your application"), "README.md", "exec"), {})
    records = read_all(settings, settings.topics.chat_turns.name)
    events = [decode_input(r.value) for r in sorted(records, key=lambda r: r.offset)]
    assert [type(e) for e in events] == [Turn, Message, SessionEnd]
    assert len({r.partition for r in records}) == 1
    assert {r.key for r in records} == {events[0].session_id.encode()}


def test_connect_helpers_and_flush_on_exit(settings: Settings, kafka_bootstrap: str) -> None:
    admin.apply(settings)
    with TurnProducer.connect(kafka_bootstrap, topic_prefix=settings.topic_prefix) as producer:
        turn = producer.send_turn(
            "app-1",
            0,
            [{"role": "user", "content": "hi"}],
            "hello",
            policy_version=3,
            ts=1790000000,
        )
        producer.send_message("app-1", "user", "thanks")
        producer.end_session("app-1")
        with pytest.raises(EventDecodeError, match=r"message\.role"):
            producer.send_message("app-1", "assistant", "not a next state")
    assert producer.delivered == 3 and producer.failed == 0  # flushed when the block ended
    assert turn.response.content == "hello" and turn.turn_type == "main"
    records = read_all(settings, settings.topics.chat_turns.name)
    assert sorted(type(decode_input(r.value)).__name__ for r in records) == [
        "Message",
        "SessionEnd",
        "Turn",
    ]
    assert {r.key for r in records} == {b"app-1"}


def test_unreachable_kafka_is_a_clear_error() -> None:
    address = f"127.0.0.1:{free_port_pair()}"
    with pytest.raises(BrokerError, match=f"Kafka at {address} is not reachable"):
        TurnProducer.connect(address, timeout_s=2)
