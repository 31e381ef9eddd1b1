from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest

from pipeline.events import DeadLetter, Turn, decode_as, decode_input
from pipeline.produce import TurnProducer
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.conftest import REPO
from tests.eventfiles import turn, write_mixed_file
from tests.kafka.helpers import read_all, turnstream


def test_turn_producer_keys_by_session_and_keeps_session_order(settings: Settings) -> None:
    admin.apply(settings)
    with TurnProducer(settings) as producer:
        for i in range(20):
            for session in ("alpha", "beta", "gamma"):
                event = decode_input(orjson.dumps(turn(session, i)))
                producer.send(event)
        producer.flush()
        assert producer.delivered == 60 and producer.failed == 0
    records = read_all(settings, settings.topics.chat_turns.name)
    assert len(records) == 60
    by_session: dict[str, list] = {}
    for rec in records:
        event = decode_input(rec.value)
        assert isinstance(event, Turn)
        assert rec.key == event.session_id.encode()
        by_session.setdefault(event.session_id, []).append((rec.partition, rec.offset, event))
    for session, items in by_session.items():
        assert len({p for p, _, _ in items}) == 1, f"{session} spread over partitions"
        ordered = [e.turn_index for _, _, e in sorted(items, key=lambda x: x[1])]
        assert ordered == list(range(20))


def test_produce_refuses_whole_file_with_any_bad_line(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    path = tmp_path / "mixed.jsonl"
    _valid, bad = write_mixed_file(path)
    result = turnstream("produce", str(path), env=cli_env)
    assert result.returncode == 1
    for line_no in bad:
        assert f"{path}:line {line_no}: " in result.stderr
    assert "nothing was sent" in result.stderr
    assert read_all(settings, settings.topics.chat_turns.name) == []
    assert read_all(settings, settings.topics.deadletter.name) == []


def test_skip_invalid_sends_valid_lines_and_dead_letters_the_rest(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    path = tmp_path / "mixed.jsonl"
    valid, bad = write_mixed_file(path)
    result = turnstream("produce", str(path), "--skip-invalid", env=cli_env)
    assert result.returncode == 0, result.stderr
    sent = read_all(settings, settings.topics.chat_turns.name)
    assert sorted(r.value for r in sent) == sorted(valid)
    letters = [
        decode_as(DeadLetter, r.value) for r in read_all(settings, settings.topics.deadletter.name)
    ]
    assert {int(d.source.rsplit(":", 1)[1]) for d in letters} == set(bad)
    raw_lines = path.read_bytes().split(b"\n")
    for letter in letters:
        line_no = int(letter.source.rsplit(":", 1)[1])
        assert letter.stage == "produce"
        assert bad[line_no] in letter.error
        assert letter.raw_bytes == len(raw_lines[line_no - 1])
        kept = base64.b64decode(letter.raw_b64)
        assert raw_lines[line_no - 1].startswith(kept)
        assert letter.truncated == (len(kept) < letter.raw_bytes)


def test_produce_without_topics_says_what_to_run(cli_env: dict[str, str]) -> None:
    result = turnstream("produce", str(REPO / "examples" / "sessions.jsonl"), env=cli_env)
    assert result.returncode == 1
    assert "turnstream topics apply" in result.stderr


def test_produce_shipped_examples(settings: Settings, cli_env: dict[str, str]) -> None:
    admin.apply(settings)
    result = turnstream("produce", str(REPO / "examples" / "sessions.jsonl"), env=cli_env)
    assert result.returncode == 0, result.stderr
    assert "sent 310 event(s)" in result.stderr
    assert len(read_all(settings, settings.topics.chat_turns.name)) == 310


@pytest.mark.parametrize("codec", ["lz4", "zstd", "snappy"])
def test_every_offered_codec_produces_and_reads_back(
    settings: Settings, cli_env: dict[str, str], codec: str
) -> None:
    # TURNSTREAM_PRODUCER_COMPRESSION offers these: the SDK (kafka-python) and produce FILE
    # (aiokafka) must both have the codec's library, and the consumers must read it back
    settings = settings.model_copy(update={"producer_compression": codec})
    admin.apply(settings)
    with TurnProducer(settings) as producer:
        for i in range(5):
            producer.send(decode_input(orjson.dumps(turn("sdk", i))))
    env = {**cli_env, "TURNSTREAM_PRODUCER_COMPRESSION": codec}
    result = turnstream("produce", str(REPO / "examples" / "sessions.jsonl"), env=env)
    assert result.returncode == 0, result.stderr
    records = read_all(settings, settings.topics.chat_turns.name)
    assert len(records) == 315
    assert sum(decode_input(r.value).session_id == "sdk" for r in records) == 5
