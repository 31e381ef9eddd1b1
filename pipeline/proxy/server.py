"""The capture proxy: OpenAI-compatible chat in front of the policy server, turns into Kafka.

``POST /v1/chat/completions`` is forwarded to the upstream (streamed responses
pass through chunk by chunk as they arrive); once the response is complete the
proxy produces a ``turn`` event to chat.turns (and a ``session_end`` when the
client said the session is done). Producing goes through :class:`EventSink`:
it never blocks or fails the user's response. ``GET /v1/models`` is forwarded;
``GET /healthz`` and ``GET /metrics`` describe the proxy itself. The rollout
route (:mod:`pipeline.proxy.rollout_route`) serves the same chat and models
under ``/rollouts/{session_id}/{group_id}/{group_size}/{max_turns}/v1/`` with
the session named by the path, and ``POST /rollouts/{session_id}/end`` ends a
rollout attempt's session through the same sink, after its turns.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.deadletters import DeadLetters
from pipeline.errors import ConfigError, EventDecodeError
from pipeline.events import SessionEnd, encode
from pipeline.proxy import metrics
from pipeline.proxy.capture import (
    BadRequest,
    Captured,
    RequestMeta,
    StreamAssembler,
    build_turn,
    from_completion,
    request_meta,
    stamped_version,
    upstream_body,
)
from pipeline.proxy.rollout_route import (
    END,
    PREFIX,
    RolloutRoute,
    parse_end,
    parse_route,
    route_headers,
)
from pipeline.proxy.sessions import SessionCounters
from pipeline.proxy.sink import EventSink
from pipeline.settings import ProxySettings, Settings

log = logging.getLogger(__name__)

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}
WEIGHT_VERSION_HEADER = "X-Weight-Version"  # the SGLang-protocol server's served version


def openai_error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


class VersionSource(Protocol):
    """The policy version stamped on a turn whose upstream names none: policy.versions
    followed (:class:`~pipeline.proxy.versions.PolicyVersions`) or the configured one
    (:class:`~pipeline.proxy.run.FixedVersion`)."""

    @property
    def current(self) -> int | None: ...


class LinkStatus(Protocol):
    """Whether Kafka takes events now, for ``/healthz``: the proxy's
    :class:`~pipeline.proxy.link.KafkaLink`."""

    @property
    def state(self) -> str: ...  # connecting | up | unreachable

    def stats(self) -> dict[str, Any]: ...


@dataclass
class ProxyState:
    settings: Settings
    sink: EventSink
    counters: SessionCounters
    versions: VersionSource
    http: aiohttp.ClientSession | None = None
    warned_sessions: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.time)
    turns: int = 0
    not_recorded: dict[str, int] = field(default_factory=dict)
    rollout_calls: dict[str, int] = field(default_factory=dict)  # in flight, per session
    # rollout sessions the stage ended (the latest, bounded): a call of theirs still in
    # flight then (a timed-out attempt's) is served but not recorded after the end
    ended_rollouts: dict[str, None] = field(default_factory=dict)
    link: LinkStatus | None = None  # None: no link (the sink alone says how Kafka is)

    @property
    def config(self) -> ProxySettings:
        return self.settings.proxy

    @property
    def upstream(self) -> str:
        if not self.config.upstream:
            raise ConfigError("no upstream: set TURNSTREAM_PROXY_UPSTREAM or pass --upstream")
        return self.config.upstream


STATE = web.AppKey("state", ProxyState)


def build_proxy(state: ProxyState) -> web.Application:
    app = web.Application(
        client_max_size=state.config.max_body_bytes,
        middlewares=[_auth_middleware(state)],
    )
    app[STATE] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_post(PREFIX + "/v1/chat/completions", rollout_chat_completions)
    app.router.add_get(PREFIX + "/v1/models", models)
    app.router.add_post(END, end_rollout)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    app.on_startup.append(_open_http)
    app.on_cleanup.append(_close_http)
    return app


def _auth_middleware(state: ProxyState) -> Any:
    key = state.config.api_key.get_secret_value().encode() if state.config.api_key else None

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if key is None or request.path in ("/healthz", "/metrics"):
            return await handler(request)
        given = request.headers.get("Authorization", "")
        token = given[7:].strip().encode() if given.lower().startswith("bearer ") else b""
        if not hmac.compare_digest(token, key):
            metrics.REQUESTS.labels("401", "-").inc()
            return openai_error(
                401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "auth_error"
            )
        return await handler(request)

    return auth


async def _open_http(app: web.Application) -> None:
    state = app[STATE]
    timeout = aiohttp.ClientTimeout(total=state.config.upstream_timeout_s)
    state.http = aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=1024), auto_decompress=True
    )


async def _close_http(app: web.Application) -> None:
    state = app[STATE]
    if state.http is not None:
        await state.http.close()


def _upstream_headers(state: ProxyState, request: web.Request) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if state.config.upstream_api_key:
        headers["Authorization"] = f"Bearer {state.config.upstream_api_key.get_secret_value()}"
    elif state.config.api_key is None and "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]  # the client's own key
    return headers


def _passthrough_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}


async def models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    assert state.http is not None
    try:
        async with state.http.get(
            state.upstream + "/v1/models", headers=_upstream_headers(state, request)
        ) as up:
            body = await up.read()
            return web.Response(status=up.status, body=body, headers=_passthrough_headers(up))
    except (TimeoutError, aiohttp.ClientError) as exc:
        return openai_error(502, f"upstream {state.upstream} unreachable: {exc}", "upstream_error")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve_chat(request, None)


async def rollout_chat_completions(request: web.Request) -> web.StreamResponse:
    """The rollout route: the plain route with the path's session and group headers."""
    try:
        route = parse_route(request.match_info)
    except BadRequest as exc:
        metrics.REQUESTS.labels("400", "-").inc()
        return openai_error(400, str(exc))
    return await _serve_chat(request, route)


async def _serve_chat(request: web.Request, route: RolloutRoute | None) -> web.StreamResponse:
    state = request.app[STATE]
    parsed = await _read_chat_request(state, request, route)
    if isinstance(parsed, web.Response):
        return parsed
    body, meta = parsed
    _warn_once(state, meta)
    if not meta.rollout:
        return await _forward(state, request, body, meta)
    calls = state.rollout_calls  # a rollout's calls in flight count towards its max_turns
    calls[meta.session_id] = calls.get(meta.session_id, 0) + 1
    try:
        return await _forward(state, request, body, meta)
    finally:
        calls[meta.session_id] -= 1
        if not calls[meta.session_id]:
            del calls[meta.session_id]


async def _forward(
    state: ProxyState, request: web.Request, body: dict[str, Any], meta: RequestMeta
) -> web.StreamResponse:
    """The request to the upstream, its answer relayed and its turn recorded."""
    forward = upstream_body(body, state.config.logprobs, state.config.token_ids)
    stream = bool(body.get("stream"))
    assert state.http is not None
    started = time.perf_counter()
    try:
        async with state.http.post(
            state.upstream + "/v1/chat/completions",
            data=orjson.dumps(forward),
            headers=_upstream_headers(state, request),
        ) as up:
            if up.status != 200:  # passed through as it is; nothing to record
                payload = await up.read()
                metrics.REQUESTS.labels(f"upstream_{up.status}", str(stream).lower()).inc()
                return web.Response(
                    status=up.status, body=payload, headers=_passthrough_headers(up)
                )
            response, captured = await _relay(request, up, stream)
    except (TimeoutError, aiohttp.ClientError) as exc:
        metrics.REQUESTS.labels("upstream_unreachable", str(stream).lower()).inc()
        return openai_error(
            502, f"upstream {state.upstream} failed: {type(exc).__name__}: {exc}", "upstream_error"
        )
    metrics.UPSTREAM_LATENCY.observe(time.perf_counter() - started)
    metrics.REQUESTS.labels("200", str(stream).lower()).inc()
    _capture(state, meta, body, captured)
    return response


async def _read_chat_request(
    state: ProxyState, request: web.Request, route: RolloutRoute | None = None
) -> tuple[dict[str, Any], RequestMeta] | web.Response:
    """The request's body and what its headers (or its rollout route) say about the turn,
    or the error to answer."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.REQUESTS.labels("413", "-").inc()
        return openai_error(
            413,
            f"request body over {state.config.max_body_bytes} bytes "
            "(TURNSTREAM_PROXY_MAX_BODY_BYTES)",
        )
    try:
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        headers: Mapping[str, str] = request.headers
        if route is not None:
            headers = route_headers(route, request.headers)
        meta = request_meta(headers, body, state.config.default_turn_type)
    except orjson.JSONDecodeError as exc:
        metrics.REQUESTS.labels("400", "-").inc()
        return openai_error(400, f"body is not valid JSON: {exc}")
    except BadRequest as exc:
        metrics.REQUESTS.labels("400", "-").inc()
        return openai_error(400, str(exc))
    if route is None:
        return body, meta
    recorded = state.counters.peek(meta.session_id) + state.rollout_calls.get(meta.session_id, 0)
    if recorded >= route.max_turns:
        metrics.REQUESTS.labels("max_turns", "-").inc()
        return openai_error(
            400,
            f"rollout session {meta.session_id!r} has {recorded} model call(s) made or in "
            f"flight, its max_turns ({route.max_turns}): this call is refused and not forwarded",
            "max_turns_exceeded",
        )
    return body, replace(meta, rollout=True, done=False)  # the rollout stage ends it


MAX_ENDED_ROLLOUTS = 100_000


def ended_rollout(state: ProxyState, session: str) -> None:
    """Remember that ``session`` was ended (the oldest of too many are forgotten)."""
    state.ended_rollouts[session] = None
    if len(state.ended_rollouts) > MAX_ENDED_ROLLOUTS:
        del state.ended_rollouts[next(iter(state.ended_rollouts))]


async def end_rollout(request: web.Request) -> web.Response:
    """End a rollout attempt's session: a ``session_end`` through the sink, after the turns
    the proxy has offered for it (the sink keeps a session's events in order)."""
    state = request.app[STATE]
    session = request.match_info["session_id"]
    try:
        end = parse_end(orjson.loads(await request.read()))
        event = SessionEnd(
            type="session_end",
            session_id=session,
            ts=time.time(),
            reason="client" if end.succeeded else "rollout_failed",
            rollout_metrics=end.rollout_metrics,
            ground_truth=end.ground_truth if end.succeeded else None,
            agent_messages=end.messages if end.succeeded else None,
        )
    except (orjson.JSONDecodeError, BadRequest, ValueError) as exc:
        return openai_error(400, f"cannot end rollout session {session!r}: {exc}")
    queued = state.sink.offer(
        state.settings.topics.chat_turns.name, session.encode(), encode(event)
    )
    ended_rollout(state, session)
    metrics.ROLLOUT_ENDS.labels("success" if end.succeeded else "failed").inc()
    if not end.succeeded:
        log.info("rollout session %s ended as failed: %s", session, end.error or "(no error given)")
    return web.json_response(
        {"session_id": session, "reason": event.reason, "queued": queued}, status=202
    )


async def _relay(
    request: web.Request, up: aiohttp.ClientResponse, stream: bool
) -> tuple[web.StreamResponse, Captured | None]:
    """The upstream's 200 answer passed on (streamed as it arrives when it streams), and the
    completion rebuilt from it, stamped with the weight version the upstream served."""
    if stream and up.content_type == "text/event-stream":
        response, captured = await _relay_stream(request, up)
    else:
        payload = await up.read()
        response = web.Response(status=200, body=payload, headers=_passthrough_headers(up))
        captured = _parse_completion(payload)
    if captured is not None:
        captured.weight_version = up.headers.get(WEIGHT_VERSION_HEADER)
    return response, captured


def _capture(
    state: ProxyState, meta: RequestMeta, body: dict[str, Any], captured: Captured | None
) -> None:
    """Record the served turn, or count why not; the user is served either way."""
    if captured is None:
        _not_recorded(state, "not_captured")
        return
    try:
        _record(state, meta, body, captured)
    except Exception:  # e.g. the counters' disk: the user is served regardless
        log.exception("recording a turn of session %s failed", meta.session_id)
        _not_recorded(state, "record_error")


def _parse_completion(payload: bytes) -> Captured | None:
    try:
        return from_completion(orjson.loads(payload))
    except Exception:  # an odd response shape: serve it, record nothing
        log.exception("cannot parse the upstream's completion; this turn is not recorded")
        return None


async def _relay_stream(
    request: web.Request, up: aiohttp.ClientResponse
) -> tuple[web.StreamResponse, Captured | None]:
    """Forward SSE chunks as they arrive while rebuilding the completion."""
    response = web.StreamResponse(status=200, headers=_passthrough_headers(up))
    await response.prepare(request)
    assembler = StreamAssembler()
    capturing = True
    try:
        async for chunk in up.content.iter_any():
            await response.write(chunk)
            if capturing:
                try:
                    assembler.feed(chunk)
                except Exception:  # recording must never break what the user receives
                    log.exception("cannot parse the upstream's stream; this turn is not recorded")
                    capturing = False
        # No write_eof here: aiohttp ends the body once the handler returns, after the turn
        # is offered to the sink, so a client that reads its answer to the end (the openai
        # SDK does) and then ends its session finds the turn queued before the end.
    except ConnectionResetError:  # the client went away: it saw the whole turn only if [DONE]
        return response, assembler.result() if capturing and assembler.done else None
    except (TimeoutError, aiohttp.ClientError) as exc:  # the upstream failed mid-stream
        log.warning("upstream stream failed part way: %s; the turn is not recorded", exc)
        return response, None
    if not capturing or not assembler.done:
        return response, None
    return response, assembler.result()


def _warn_once(state: ProxyState, meta: RequestMeta) -> None:
    if meta.session_given and meta.turn_type_given:
        return
    key = meta.session_id
    if key in state.warned_sessions or len(state.warned_sessions) > 100_000:
        return
    state.warned_sessions.add(key)
    if not meta.session_given:
        log.warning(
            "a request without X-Session-Id: recorded under session %r; send X-Session-Id so "
            "turns pair with their own next state",
            meta.session_id,
        )
    if not meta.turn_type_given:
        log.warning(
            "session %r: a request without X-Turn-Type is recorded as a %s turn%s",
            meta.session_id,
            meta.turn_type,
            " (side turns never train; send X-Turn-Type: main)" if meta.turn_type == "side" else "",
        )


def _not_recorded(state: ProxyState, reason: str) -> None:
    state.not_recorded[reason] = state.not_recorded.get(reason, 0) + 1
    metrics.SKIPPED.labels(reason).inc()


def _record(state: ProxyState, meta: RequestMeta, body: dict[str, Any], captured: Captured) -> None:
    topics = state.settings.topics
    now = time.time()
    if captured.empty:
        _not_recorded(state, "empty_response")
    elif meta.rollout and meta.session_id in state.ended_rollouts:
        _not_recorded(state, "after_rollout_end")
    else:
        index = state.counters.take(meta.session_id)
        try:
            version = stamped_version(captured.weight_version, state.versions.current)
            turn = build_turn(meta, index, body, captured, version, now)
        except EventDecodeError as exc:
            _not_recorded(state, "invalid_turn")
            raw = orjson.dumps({"request": body, "response": captured.__dict__})
            dead = DeadLetters(topics)
            letter = dead.encoded("proxy", str(exc), f"proxy/{meta.session_id}/{index}", raw)
            state.sink.offer(dead.topic, None, letter)
            log.warning("session %s turn %d not recorded: %s", meta.session_id, index, exc)
        else:
            state.sink.offer(topics.chat_turns.name, meta.session_id.encode(), encode(turn))
            state.turns += 1
            metrics.TURNS.labels(meta.turn_type, "given" if meta.session_given else "missing").inc()
    if meta.done:
        end = SessionEnd(type="session_end", session_id=meta.session_id, ts=now, reason="client")
        state.sink.offer(topics.chat_turns.name, meta.session_id.encode(), encode(end))


async def healthz(request: web.Request) -> web.Response:
    """The proxy's state; "degraded" (still 200: it serves) while turns wait for Kafka."""
    state = request.app[STATE]
    sink = state.sink.stats()
    status, degraded = "ok", None
    if state.link is not None:
        sink.update(state.link.stats())
        if state.link.state != "up":
            status = "degraded"
            degraded = (
                f"Kafka {state.link.state} since {sink['down_since'] or 'start'}: "
                f"{sink['problem'] or 'connecting'}; captured turns are spooled to "
                f"{sink['spool_dir']} ({sink['spool_pending']} waiting) and sent when it is back"
            )
    return web.json_response(
        {
            "status": status,
            "degraded": degraded,
            "upstream": state.config.upstream,
            "uptime_s": round(time.time() - state.started, 1),
            "turns_recorded": state.turns,
            "not_recorded": state.not_recorded,
            "policy_version": state.versions.current,
            "sessions_known": len(state.counters),
            "kafka": sink,
        }
    )


async def prometheus(_request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})
