"""Interop with kcat (librdkafka), a client nobody here wrote."""

from __future__ import annotations

import shutil
import subprocess

import orjson
import pytest

from pipeline.events import Message, Turn, decode_input
from pipeline.produce import TurnProducer
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.conftest import REPO
from tests.eventfiles import turn
from tests.kafka.helpers import read_all, turnstream

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


@pytest.fixture
def kcat() -> str:
    if KCAT is None:
        pytest.fail("kcat is not installed (apt-get install kcat); the interop tests need it")
    return KCAT


def test_events_produced_by_kcat_decode(settings: Settings, kcat: str) -> None:
    admin.apply(settings)
    events = [
        turn("k-1", 0),
        {
            "type": "message",
            "session_id": "k-1",
            "ts": 3.5,
            "message": {"role": "tool", "content": "exit 0"},
        },
    ]
    payload = b"".join(b"k-1\t" + orjson.dumps(e) + b"\n" for e in events)
    subprocess.run(
        [
            kcat,
            "-P",
            "-b",
            settings.bootstrap_servers,
            "-t",
            settings.topics.chat_turns.name,
            "-K",
            "\t",
        ],
        input=payload,
        check=True,
        timeout=60,
    )
    records = read_all(settings, settings.topics.chat_turns.name)
    # One key, so one partition: kcat's order is kept.
    decoded = [decode_input(r.value) for r in sorted(records, key=lambda r: r.offset)]
    assert isinstance(decoded[0], Turn) and decoded[0].sample_id == "k-1:0"
    assert isinstance(decoded[1], Message) and decoded[1].message.content == "exit 0"
    assert {r.key for r in records} == {b"k-1"}


def test_kcat_reads_what_turn_producer_sent(settings: Settings, kcat: str) -> None:
    admin.apply(settings)
    with TurnProducer(settings) as producer:
        for i in range(5):
            producer.send(decode_input(orjson.dumps(turn("p-7", i))))
        producer.flush()
    out = subprocess.run(
        [
            kcat,
            "-C",
            "-b",
            settings.bootstrap_servers,
            "-t",
            settings.topics.chat_turns.name,
            "-e",
            "-q",
            "-f",
            "%k\t%s\n",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    rows = [line.split(b"\t", 1) for line in out.splitlines() if line]
    assert len(rows) == 5
    assert {key for key, _ in rows} == {b"p-7"}
    assert sorted(orjson.loads(value)["turn_index"] for _, value in rows) == list(range(5))


@pytest.mark.parametrize("level", ["1", "9"])
def test_kcat_reads_gzip_batches_produce_file_wrote_at_a_level(
    settings: Settings, cli_env: dict[str, str], kcat: str, level: str
) -> None:
    admin.apply(settings)
    env = {**cli_env, "TURNSTREAM_PRODUCER_COMPRESSION": "gzip",
           "TURNSTREAM_PRODUCER_GZIP_LEVEL": level}  # fmt: skip
    result = turnstream("produce", str(REPO / "examples" / "sessions.jsonl"), env=env)
    assert result.returncode == 0, result.stderr
    out = subprocess.run(
        [kcat, "-C", "-b", settings.bootstrap_servers, "-t", settings.topics.chat_turns.name,
         "-e", "-q", "-f", "%s\n"],
        capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    events = [decode_input(line) for line in out.splitlines() if line]
    assert len(events) == 310
    assert len({e.session_id for e in events}) > 1
