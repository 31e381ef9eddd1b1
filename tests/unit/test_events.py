from __future__ import annotations

import base64

import orjson
import pytest

from pipeline.errors import EventDecodeError
from pipeline.events import (
    DeadLetter,
    JudgeIdentity,
    Message,
    Paired,
    Response,
    Sample,
    SessionEnd,
    Turn,
    dead_letter,
    decode_as,
    decode_input,
    encode,
    json_schemas,
)
from tests.conftest import REPO

TURN = {
    "type": "turn",
    "session_id": "s1",
    "turn_index": 0,
    "turn_type": "main",
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
    "response": {"content": "hello"},
    "ts": 1790000000.5,
}


def raw(obj: object) -> bytes:
    return orjson.dumps(obj)


def test_turn_decodes_with_defaults() -> None:
    turn = decode_input(raw(TURN))
    assert isinstance(turn, Turn)
    assert turn.schema_version == 1
    assert turn.sample_id == "s1:0"
    assert turn.messages[1].content == "hi"
    assert turn.response_ids is None


def test_message_and_session_end_decode() -> None:
    msg = decode_input(
        raw(
            {
                "type": "message",
                "session_id": "s1",
                "ts": 1,
                "message": {"role": "tool", "content": "ok", "tool_call_id": "c1"},
            }
        )
    )
    assert isinstance(msg, Message) and msg.message.role == "tool"
    end = decode_input(raw({"type": "session_end", "session_id": "s1", "ts": 2}))
    assert isinstance(end, SessionEnd)


def test_provider_fields_on_messages_are_kept() -> None:
    data = dict(TURN, messages=[{"role": "assistant", "content": "x", "reasoning_content": "r"}])
    turn = decode_input(raw(data))
    assert isinstance(turn, Turn)
    assert orjson.loads(encode(turn))["messages"][0]["reasoning_content"] == "r"


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({k: v for k, v in TURN.items() if k != "session_id"}, "session_id", "missing"),
        ({k: v for k, v in TURN.items() if k != "response"}, "response", "missing"),
        (dict(TURN, turn_index="3"), "turn_index", "integer"),
        (dict(TURN, turn_index=-1), "turn_index", "greater than or equal"),
        (dict(TURN, turn_type="primary"), "turn_type", "'main' or 'side'"),
        (dict(TURN, messages=[]), "messages", "at least 1"),
        (dict(TURN, messages=[{"role": "robot", "content": "x"}]), "messages[0].role", "'user'"),
        (dict(TURN, sesion_id="x"), "sesion_id", "unknown field"),
        (dict(TURN, session_id=""), "session_id", "at least 1"),
        (dict(TURN, ts="yesterday"), "ts", "number"),
        (dict(TURN, schema_version=2), "schema_version", "1"),
        (dict(TURN, response={"content": 5}), "response.content", "string"),
        (
            dict(TURN, response_ids=[1, 2], response_logprobs=[-0.1]),
            "",
            "response_logprobs has 1 entries but response_ids has 2",
        ),
        (dict(TURN, type="chat"), "type", "expected 'turn', 'message' or 'session_end'"),
        (
            {
                "type": "message",
                "session_id": "s",
                "ts": 1,
                "message": {"role": "assistant", "content": "x"},
            },
            "message.role",
            "'user' or 'tool'",
        ),
    ],
)
def test_invalid_events_name_field_and_problem(data: dict, field: str, problem: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_input(raw(data))
    assert info.value.field == field
    assert problem in info.value.problem


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b'{"type": "turn", ', "not valid JSON"),
        (b'{"type": "turn", "session_id": "\xff\xfe"}', "not valid UTF-8 at byte 32"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'"turn"', "expected a JSON object, got str"),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
    ],
)
def test_undecodable_input(payload: bytes, problem: str) -> None:
    with pytest.raises(EventDecodeError, match=problem):
        decode_input(payload)


def test_encode_round_trips_every_event_kind() -> None:
    turn = decode_input(raw(TURN))
    assert isinstance(turn, Turn)
    paired = Paired(
        sample_id=turn.sample_id, turn=turn, next_state=None, first_judged=False, paired_ts=3.0
    )
    assert decode_as(Paired, encode(paired)) == paired
    sample = Sample(
        sample_id="s1:0",
        session_id="s1",
        turn_index=0,
        messages=list(turn.messages),
        response=Response(content="hello"),
        next_state=None,
        score=0.0,
        votes=[1, None, -1],
        judge_calls=3,
        exclude_reason="no_next_state",
        loss_mask=0,
        mode="rl",
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
    )
    assert decode_as(Sample, encode(sample)) == sample


def test_decode_as_reports_field() -> None:
    with pytest.raises(EventDecodeError) as info:
        decode_as(Sample, b'{"type": "sample"}')
    assert info.value.field == "sample_id"


def test_dead_letter_keeps_raw_bytes_and_truncates_huge_input() -> None:
    small = dead_letter("produce", "bad", "f.jsonl:3", b"\xffabc", ts=1.0, max_raw_bytes=100)
    assert base64.b64decode(small.raw_b64) == b"\xffabc"
    assert not small.truncated
    big = dead_letter("produce", "bad", "f.jsonl:4", b"x" * 1000, ts=1.0, max_raw_bytes=100)
    assert big.truncated and big.raw_bytes == 1000
    assert len(base64.b64decode(big.raw_b64)) == 100
    assert decode_as(DeadLetter, encode(big)) == big


def test_json_schemas_cover_every_event() -> None:
    schemas = json_schemas()
    assert set(schemas) >= {
        "turn.schema.json",
        "message.schema.json",
        "session_end.schema.json",
        "paired.schema.json",
        "sample.schema.json",
        "deadletter.schema.json",
    }
    turn = schemas["turn.schema.json"]
    assert {"session_id", "turn_index", "turn_type", "messages", "response", "ts"} <= set(
        turn["required"]
    )
    assert turn["additionalProperties"] is False


def test_shipped_examples_are_valid_and_varied() -> None:
    kinds: dict[str, int] = {}
    sessions = set()
    for line in (REPO / "examples" / "sessions.jsonl").read_bytes().splitlines():
        event = decode_input(line)
        key = event.type + (f":{event.turn_type}" if isinstance(event, Turn) else "")
        kinds[key] = kinds.get(key, 0) + 1
        sessions.add(event.session_id)
    assert len(sessions) == 50
    assert kinds["turn:main"] > 100 and kinds["turn:side"] > 0
    assert kinds["message"] > 0 and kinds["session_end"] > 0


def test_a_record_without_value_is_a_decode_error_and_can_be_dead_lettered() -> None:
    with pytest.raises(EventDecodeError, match="no value"):
        decode_input(None)
    with pytest.raises(EventDecodeError, match="no value"):
        decode_as(Sample, None)
    letter = dead_letter("pair", "no value", "t/0/1", None, ts=1.0, max_raw_bytes=10)
    assert letter.raw_bytes == 0 and letter.raw_b64 == ""
