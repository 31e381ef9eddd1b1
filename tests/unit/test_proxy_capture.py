"""The capture proxy's pure parts: session headers, body rewriting, stream assembly, turns."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeline.errors import EventDecodeError
from pipeline.proxy.capture import (
    BadRequest,
    Captured,
    StreamAssembler,
    build_turn,
    from_completion,
    request_meta,
    stamped_version,
    upstream_body,
)
from pipeline.proxy.sessions import SessionCounters

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_headers_win_over_body_fields_and_flags_read_like_openclaw() -> None:
    meta = request_meta(
        {"X-Session-Id": "h", "X-Turn-Type": "Main", "X-Session-Done": "yes"},
        {**BODY, "session_id": "b", "turn_type": "side"},
        "side",
    )
    assert (meta.session_id, meta.turn_type, meta.done) == ("h", "main", True)
    assert meta.session_given and meta.turn_type_given
    body = request_meta({}, {**BODY, "session_id": "b", "session_done": "1"}, "side")
    assert (body.session_id, body.turn_type, body.done, body.turn_type_given) == (
        "b",
        "side",
        True,
        False,
    )
    for off in ("0", "false", "no", "off", ""):
        assert not request_meta({"X-Session-Done": off}, BODY, "main").done


def test_missing_session_is_recorded_as_unknown_and_flagged() -> None:
    meta = request_meta({}, BODY, "main")
    assert meta.session_id == "unknown" and not meta.session_given and meta.turn_type == "main"


@pytest.mark.parametrize(
    ("headers", "body", "needle"),
    [
        ({"X-Turn-Type": "primary"}, BODY, "X-Turn-Type must be 'main' or 'side'"),
        ({"X-Session-Id": "x" * 300}, BODY, "300 characters"),
        ({}, {**BODY, "session_id": 12}, "session_id must be a string"),
    ],
)
def test_bad_session_fields_are_client_errors(headers: dict, body: dict, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        request_meta(headers, body, "side")


def test_upstream_body_strips_session_fields_and_asks_for_logprobs() -> None:
    body = {**BODY, "session_id": "s", "session_done": True, "turn_type": "main", "top_p": 0.9}
    out = upstream_body(body, logprobs=True, token_ids=True)
    assert out == {**BODY, "top_p": 0.9, "logprobs": True, "return_token_ids": True}
    assert "logprobs" not in upstream_body(BODY, logprobs=False, token_ids=False)
    assert body["session_id"] == "s"  # the caller's dict is untouched


def sse(*chunks: dict, done: bool = True) -> bytes:
    out = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


def delta(d: dict, lp: float | None = None, ids: list[int] | None = None, **extra) -> dict:
    choice: dict = {"index": 0, "delta": d, "finish_reason": extra.pop("finish", None)}
    if lp is not None:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": lp, "top_logprobs": []}]}
    if ids is not None:
        choice["token_ids"] = ids
    return {"object": "chat.completion.chunk", "choices": [choice], **extra}


def test_stream_assembly_survives_arbitrary_chunk_boundaries() -> None:
    data = sse(
        delta({"role": "assistant", "content": "Hel"}, -0.1, [1], prompt_token_ids=[7, 8]),
        delta({"content": "lo"}, -0.2, [2]),
        delta({"content": " ✓"}, -0.3, [3]),
        delta({}, finish="stop"),
    ).replace(b"\n\n", b"\r\n\r\n", 1)
    for step in (1, 3, 7, len(data)):
        asm = StreamAssembler()
        for i in range(0, len(data), step):
            asm.feed(data[i : i + step])
        got = asm.result()
        assert asm.done and asm.malformed == 0
        assert got == Captured("Hello ✓", None, [-0.1, -0.2, -0.3], [1, 2, 3], [7, 8], "stop")


def test_stream_tool_call_deltas_are_joined() -> None:
    head = {"index": 0, "id": "c1", "type": "function", "function": {"name": "search"}}
    asm = StreamAssembler()
    asm.feed(
        sse(
            delta({"role": "assistant", "tool_calls": [head]}),
            delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}),
            delta({"tool_calls": [{"index": 0, "function": {"arguments": '"kafka"}'}}]}),
            delta({}, finish="tool_calls"),
        )
    )
    got = asm.result()
    assert got.content is None and got.finish_reason == "tool_calls"
    assert got.tool_calls == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "search", "arguments": '{"q": "kafka"}'},
        }
    ]


def test_a_stream_without_done_is_not_complete_and_junk_lines_are_counted() -> None:
    asm = StreamAssembler()
    asm.feed(b": keep-alive\n\ndata: {not json}\n\n" + sse(delta({"content": "x"}), done=False))
    assert not asm.done and asm.malformed == 1 and asm.result().content == "x"


def test_non_streamed_completion_is_captured() -> None:
    data = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "logprobs": {"content": [{"token": "ok", "logprob": -0.5}]},
                "token_ids": [42],
                "finish_reason": "stop",
            }
        ],
        "prompt_token_ids": [1, 2],
    }
    assert from_completion(data) == Captured("ok", None, [-0.5], [42], [1, 2], "stop")
    sglang = {
        "choices": [
            {
                **data["choices"][0],
                "response_token_ids": [42],  # SGLang's names
                "prompt_token_ids": [1, 2],
            }
        ]
    }
    del sglang["choices"][0]["token_ids"]
    assert from_completion(sglang) == Captured("ok", None, [-0.5], [42], [1, 2], "stop")
    assert from_completion({"choices": []}).empty
    # a policy that ends its turn at once answered: "" is its action, recorded and trained
    ended = {
        "choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}]
    }
    assert not from_completion(ended).empty
    assert not from_completion({"choices": [{"message": {}, "token_ids": [2]}]}).empty
    broken = {"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"x": 1}]}}]}
    assert from_completion(broken).logprobs is None  # an entry without a log-prob: none kept


def test_build_turn_keeps_ids_when_logprobs_disagree_and_names_bad_fields() -> None:
    meta = request_meta({"X-Session-Id": "s", "X-Turn-Type": "main"}, BODY, "side")
    turn = build_turn(meta, 3, BODY, Captured("ok", None, [-0.1], [1, 2], None, "stop"), 5, 1.0)
    assert turn.turn_index == 3 and turn.policy_version == 5 and turn.sample_id == "s:3"
    assert turn.response_ids == [1, 2] and turn.response_logprobs is None
    bad = {"messages": [{"role": "wizard", "content": "?"}]}
    with pytest.raises(EventDecodeError, match="messages"):
        build_turn(meta, 0, bad, Captured("ok"), None, 1.0)


def test_group_headers_mark_the_turn_as_one_output_of_a_group() -> None:
    headers = {"X-Session-Id": "s", "X-Group-Id": "prompt-7", "X-Group-Size": "4"}
    meta = request_meta(headers, BODY, "main")
    turn = build_turn(meta, 0, BODY, Captured("ok"), None, 1.0)
    assert (turn.group_id, turn.group_size) == ("prompt-7", 4)
    body = {**BODY, "group_id": "p", "group_size": 2}
    assert request_meta({}, body, "main").group_size == 2
    assert "group_id" not in upstream_body(body, logprobs=False, token_ids=False)
    assert (
        build_turn(request_meta({}, BODY, "main"), 0, BODY, Captured("ok"), None, 1).group_id
        is None
    )


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"X-Group-Id": "g", "X-Group-Size": "0"}, "integer 1..1024"),
        ({"X-Group-Id": "g", "X-Group-Size": "four"}, "integer 1..1024"),
        ({"X-Group-Size": "3"}, "needs X-Group-Id"),
        ({"X-Group-Id": " "}, "non-empty string"),
        ({"X-Group-Id": "g" * 300}, "at most 256"),
    ],
)
def test_bad_group_headers_are_client_errors(headers: dict, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        request_meta(headers, BODY, "main")


def test_session_counters_continue_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite"
    counters = SessionCounters(path)
    assert [counters.take("a"), counters.take("a"), counters.take("b")] == [0, 1, 0]
    counters.close()
    again = SessionCounters(path)
    assert again.take("a") == 2 and len(again) == 2
    assert again.forget_older_than(3600) == 0
    assert again.forget_older_than(-1) == 2 and again.take("a") == 0


def test_reasoning_content_is_captured_for_training() -> None:
    data = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "42", "reasoning_content": "6 x 7"},
                "finish_reason": "stop",
            }
        ]
    }
    assert from_completion(data).reasoning_content == "6 x 7"
    asm = StreamAssembler()
    asm.feed(
        sse(
            delta({"role": "assistant", "reasoning_content": "6 x "}),
            delta({"reasoning_content": "7"}),
            delta({"content": "42"}, finish="stop"),
        )
    )
    got = asm.result()
    assert (got.reasoning_content, got.content) == ("6 x 7", "42")
    turn = build_turn(request_meta({}, BODY, "main"), 0, BODY, got, None, 1.0)
    assert turn.response.reasoning_content == "6 x 7"


def test_a_turn_carries_the_version_the_upstream_says_served_it() -> None:
    assert stamped_version("3", announced=2) == 3  # pushed, announced later: the server knows
    assert stamped_version(None, announced=2) == 2  # an upstream that does not say
    assert stamped_version("default", announced=None) is None  # SGLang's unversioned weights
    assert stamped_version("1,2", announced=2) == 2  # several choices across a push
