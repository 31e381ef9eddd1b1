"""What the capture proxy reads from a request and its response: the pure part.

Session headers follow OpenClaw-RL's proxy, so an OpenClaw agent can point at
turnstream unchanged: ``X-Session-Id`` (or a ``session_id`` body field),
``X-Turn-Type: main|side`` (or ``turn_type``), ``X-Session-Done`` (or
``session_done``; 1/true/yes/on). For group rewards, ``X-Group-Id`` and
``X-Group-Size`` (or ``group_id`` and ``group_size``) mark the turn as one of
several outputs for one prompt. The body fields are removed before the
request goes upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from pipeline.events import MAX_GROUP_SIZE, MAX_SESSION_ID_CHARS, Turn, decode_as

EXTRA_FIELDS = ("session_id", "session_done", "turn_type", "group_id", "group_size")
TRUTHY = {"1", "true", "yes", "on"}
UNKNOWN_SESSION = "unknown"


class BadRequest(ValueError):
    """The client's request cannot be served as sent (answered with 400)."""


@dataclass(frozen=True)
class RequestMeta:
    session_id: str
    session_given: bool
    turn_type: Literal["main", "side"]
    turn_type_given: bool
    done: bool
    group_id: str | None = None
    group_size: int | None = None
    rollout: bool = False  # served on the rollout route: a rollout attempt's turn


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in TRUTHY


def request_meta(
    headers: Mapping[str, str], body: dict[str, Any], default_turn_type: Literal["main", "side"]
) -> RequestMeta:
    """Session id, turn type and end-of-session flag; headers win over body fields."""
    session = headers.get("X-Session-Id") or body.get("session_id")
    if session is not None and not isinstance(session, str):
        raise BadRequest(f"session_id must be a string, got {type(session).__name__}")
    if session is not None and not session.strip():
        session = None
    if session is not None and len(session) > MAX_SESSION_ID_CHARS:
        raise BadRequest(
            f"session id is {len(session)} characters; at most {MAX_SESSION_ID_CHARS} are allowed"
        )
    raw_type = headers.get("X-Turn-Type") or body.get("turn_type")
    if raw_type is None:
        turn_type = default_turn_type
    else:
        turn_type = str(raw_type).strip().lower()  # type: ignore[assignment]
        if turn_type not in ("main", "side"):
            raise BadRequest(f"X-Turn-Type must be 'main' or 'side', got {raw_type!r}")
    done_raw = headers.get("X-Session-Done")
    if done_raw is None:
        done_raw = body.get("session_done", False)
    group_id, group_size = _group(headers, body)
    return RequestMeta(
        session_id=session or UNKNOWN_SESSION,
        session_given=session is not None,
        turn_type=turn_type,
        turn_type_given=raw_type is not None,
        done=_flag(done_raw),
        group_id=group_id,
        group_size=group_size,
    )


def _group(headers: Mapping[str, str], body: dict[str, Any]) -> tuple[str | None, int | None]:
    """The group id and size a request names, if any; nonsense is a 400."""
    group = headers.get("X-Group-Id") or body.get("group_id")
    if group is not None and (not isinstance(group, str) or not group.strip()):
        raise BadRequest("X-Group-Id must be a non-empty string")
    if group is not None and len(group) > MAX_SESSION_ID_CHARS:
        raise BadRequest(f"group id is {len(group)} characters; at most {MAX_SESSION_ID_CHARS}")
    raw_size = headers.get("X-Group-Size") or body.get("group_size")
    if raw_size is None:
        return group, None
    try:
        size = int(raw_size)
    except (TypeError, ValueError):
        size = 0
    if not 1 <= size <= MAX_GROUP_SIZE or isinstance(raw_size, (bool, float)):
        raise BadRequest(f"X-Group-Size must be an integer 1..{MAX_GROUP_SIZE}, got {raw_size!r}")
    if group is None:
        raise BadRequest("X-Group-Size needs X-Group-Id: name the group")
    return group, size


def upstream_body(body: dict[str, Any], logprobs: bool, token_ids: bool) -> dict[str, Any]:
    """The body sent upstream: session fields removed, log-probs (and ids) requested."""
    out = {k: v for k, v in body.items() if k not in EXTRA_FIELDS}
    if logprobs:
        out["logprobs"] = True
    if token_ids:
        out["return_token_ids"] = True
    return out


@dataclass
class Captured:
    """The first choice of a completion, as the proxy records it."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    logprobs: list[float] | None = None
    token_ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None
    reasoning_content: str | None = None  # a thinking model's, trained where rendered
    weight_version: str | None = None  # what the upstream says served it (X-Weight-Version)

    @property
    def empty(self) -> bool:
        """No answer at all (no choice came back). An answer that ended at once, with no
        text, is not empty: ending the turn was the policy's action, and it is trained."""
        return (
            not self.content
            and not self.tool_calls
            and not self.token_ids
            and self.finish_reason is None
        )


def _logprob_values(logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("content"), list):
        return None
    entries = [e for e in logprobs["content"] if isinstance(e, dict)]
    values = [e.get("logprob") for e in entries]
    if not values or len(entries) != len(logprobs["content"]):
        return None
    out = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return out if len(out) == len(values) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def from_completion(data: Any) -> Captured:
    """Capture a non-streamed chat completion (choice 0).

    Token ids under vLLM's names (``choices[0].token_ids``, top-level
    ``prompt_token_ids``) or SGLang's (``choices[0].response_token_ids`` and
    ``choices[0].prompt_token_ids``)."""
    if not isinstance(data, dict) or not data.get("choices"):
        return Captured()
    choice = data["choices"][0]
    message = choice.get("message") or {}
    return Captured(
        content=message.get("content") or None,
        tool_calls=message.get("tool_calls") or None,
        reasoning_content=_text(message.get("reasoning_content")),
        logprobs=_logprob_values(choice.get("logprobs")),
        token_ids=_int_list(choice.get("token_ids")) or _int_list(choice.get("response_token_ids")),
        prompt_ids=_int_list(data.get("prompt_token_ids"))
        or _int_list(choice.get("prompt_token_ids")),
        finish_reason=choice.get("finish_reason"),
    )


@dataclass
class StreamAssembler:
    """Rebuilds choice 0 of a streamed completion from its SSE chunks as they pass."""

    _buffer: bytes = b""
    _content: list[str] = field(default_factory=list)
    _reasoning: list[str] = field(default_factory=list)
    _tools: dict[int, dict[str, Any]] = field(default_factory=dict)
    _logprobs: list[Any] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)
    _prompt_ids: list[int] | None = None
    finish_reason: str | None = None
    done: bool = False
    malformed: int = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # blank separators, comments, event: / id: fields
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed += 1
            return
        if not isinstance(chunk, dict):
            self.malformed += 1
            return
        if self._prompt_ids is None:
            self._prompt_ids = _int_list(chunk.get("prompt_token_ids"))
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self._content.append(delta["content"])
        if isinstance(delta.get("reasoning_content"), str):
            self._reasoning.append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or []:
            slot = self._tools.setdefault(
                int(call.get("index", 0)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if call.get("id"):
                slot["id"] = call["id"]
            if call.get("type"):
                slot["type"] = call["type"]
            fn = call.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            self._logprobs.extend(logprobs["content"])
        ids = _int_list(choice.get("token_ids"))
        if ids:
            self._ids.extend(ids)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def result(self) -> Captured:
        tools = [self._tools[i] for i in sorted(self._tools)] or None
        return Captured(
            content="".join(self._content) or None,
            tool_calls=tools,
            reasoning_content="".join(self._reasoning) or None,
            logprobs=_logprob_values({"content": self._logprobs}),
            token_ids=self._ids or None,
            prompt_ids=self._prompt_ids,
            finish_reason=self.finish_reason,
        )


def stamped_version(weight_version: str | None, announced: int | None) -> int | None:
    """The policy version a turn carries: the one the upstream says served it, when it names
    a trainer version (an integer, as the embedded server reports the trainer's ``v000012``
    pushes), else the newest one announced on policy.versions."""
    if weight_version is not None and weight_version.strip().isdigit():
        return int(weight_version)
    return announced


def build_turn(
    meta: RequestMeta,
    turn_index: int,
    body: dict[str, Any],
    captured: Captured,
    policy_version: int | None,
    ts: float,
) -> Turn:
    """The ``turn`` event of one served request; EventDecodeError names what is invalid."""
    logprobs = captured.logprobs
    if (
        logprobs is not None
        and captured.token_ids is not None
        and len(logprobs) != len(captured.token_ids)
    ):
        logprobs = None  # the upstream's ids and log-probs disagree: keep the ids only
    event: dict[str, Any] = {
        "type": "turn",
        "session_id": meta.session_id,
        "ts": ts,
        "turn_index": turn_index,
        "turn_type": meta.turn_type,
        "messages": body.get("messages"),
        "response": {
            "content": captured.content,
            "tool_calls": captured.tool_calls,
            "reasoning_content": captured.reasoning_content,
            "finish_reason": captured.finish_reason,
        },
        "tools": body.get("tools") or None,
        "prompt_ids": captured.prompt_ids,
        "response_ids": captured.token_ids,
        "response_logprobs": logprobs,
        "policy_version": policy_version,
        "group_id": meta.group_id,
        "group_size": meta.group_size,
        "rollout": meta.rollout,
    }
    return decode_as(Turn, orjson.dumps(event))
