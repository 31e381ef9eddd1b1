"""The proxy's rollout route: a base URL that names a rollout attempt's session (pure).

A rollout processor is handed an OpenAI base URL on the capture proxy::

    {proxy}/rollouts/{session_id}/{group_id}/{group_size}/{max_turns}/v1

and any client it builds on it (its own ``openai`` client, or ``trace_client``)
is captured as that attempt's turns: a request under the prefix is served as
the plain ``/v1/...`` route with ``X-Session-Id``, ``X-Group-Id`` and
``X-Group-Size`` set from the path, ``X-Turn-Type: main`` unless the request
names one, and the turn marked as a rollout's (its pairs wait for the end of
the session). A model call beyond ``max_turns`` recorded turns of the session
is refused with 400 (``max_turns_exceeded``). The rollout stage ends the
session with ``POST {proxy}/rollouts/{session_id}/end``. Each segment is
percent-encoded, so ids may hold any character, ``/`` included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from multidict import CIMultiDict

from pipeline.events import MAX_GROUP_SIZE, MAX_SESSION_ID_CHARS
from pipeline.proxy.capture import BadRequest

PREFIX = "/rollouts/{session_id}/{group_id}/{group_size}/{max_turns}"
END = "/rollouts/{session_id}/end"
END_STATUSES = ("success", "failed")


@dataclass(frozen=True)
class RolloutRoute:
    """What a rollout route's path names: the attempt's session, its group and its bound."""

    session_id: str
    group_id: str
    group_size: int
    max_turns: int

    def headers(self) -> dict[str, str]:
        """The session headers the plain route would be sent."""
        return {
            "X-Session-Id": self.session_id,
            "X-Group-Id": self.group_id,
            "X-Group-Size": str(self.group_size),
        }


def proxy_root(model_url: str) -> str:
    """The proxy's root from its OpenAI base URL (``http://host:30000/v1`` or without /v1)."""
    root = model_url.rstrip("/")
    return root.removesuffix("/v1")


def _segment(value: str) -> str:
    return quote(value, safe="")


def base_url(model_url: str, route: RolloutRoute) -> str:
    """The OpenAI base URL a rollout attempt's clients use: the proxy's rollout route."""
    path = PREFIX.format(
        session_id=_segment(route.session_id),
        group_id=_segment(route.group_id),
        group_size=route.group_size,
        max_turns=route.max_turns,
    )
    return f"{proxy_root(model_url)}{path}/v1"


def end_url(model_url: str, session_id: str) -> str:
    """Where the rollout stage ends an attempt's session."""
    return proxy_root(model_url) + END.format(session_id=_segment(session_id))


def _bounded_int(raw: str, name: str, high: int | None) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1 or (high is not None and value > high):
        limit = f"1..{high}" if high is not None else "1 or more"
        raise BadRequest(f"rollout route: {name} must be an integer {limit}, got {raw!r}")
    return value


def parse_route(match: Mapping[str, str]) -> RolloutRoute:
    """The route of a request's path segments (already percent-decoded); nonsense is a 400."""
    for name in ("session_id", "group_id"):
        value = match[name]
        if not value.strip() or len(value) > MAX_SESSION_ID_CHARS:
            raise BadRequest(
                f"rollout route: {name} must be 1..{MAX_SESSION_ID_CHARS} characters, "
                f"got {len(value)}"
            )
    return RolloutRoute(
        session_id=match["session_id"],
        group_id=match["group_id"],
        group_size=_bounded_int(match["group_size"], "group_size", MAX_GROUP_SIZE),
        max_turns=_bounded_int(match["max_turns"], "max_turns", None),
    )


def route_headers(route: RolloutRoute, headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The request's headers as the plain route would see them: the route's session and
    group in place of any the request sent, a main turn unless it says otherwise, and no
    ``X-Session-Done`` (the rollout stage ends the session)."""
    out: CIMultiDict[str] = CIMultiDict(headers)
    out.popall("X-Session-Done", None)
    for name, value in route.headers().items():
        out[name] = value
    out.setdefault("X-Turn-Type", "main")
    return out


@dataclass(frozen=True)
class EndRequest:
    """What the rollout stage says about an attempt when it ends its session."""

    succeeded: bool
    rollout_metrics: dict[str, float]
    error: str | None
    ground_truth: Any = None  # the task's, for the reward processors
    messages: list[dict[str, Any]] | None = None  # the rollout's AgentOutput messages


def parse_end(body: Any) -> EndRequest:
    """``{"status": "success"|"failed", "rollout_metrics": {...}, "error": "...",
    "ground_truth": any, "messages": [{"role": ...}, ...]}``."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with status success or failed")
    status = body.get("status")
    if status not in END_STATUSES:
        raise BadRequest(f"status must be 'success' or 'failed', got {status!r}")
    raw = body.get("rollout_metrics") or {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in raw.items()
    ):
        raise BadRequest("rollout_metrics must be an object of names to numbers")
    metrics = {k: float(v) for k, v in raw.items()}
    messages = _messages(body.get("messages"))
    error = body.get("error")
    return EndRequest(status == "success", metrics, error, body.get("ground_truth"), messages)


def _messages(raw: Any) -> list[dict[str, Any]] | None:
    """The rollout's messages: absent, or a list of objects that each name a string role."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest(f"messages must be a list of message objects, got {type(raw).__name__}")
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages[{index}] must be an object with a string role")
    return raw
