"""The console's aiohttp server: the page, its JSON API and the review POST.

Routes: ``/`` (the page; its state in the query string), ``/sample/{id}`` (the page with
that sample open), ``/api/status``, ``/api/versions``, ``/api/samples``,
``/api/sample/{id}`` (a sample's raw JSON), ``POST /review`` (a verdict onto ``reviews``)
and ``/static/`` (the stylesheet, shipped in the package: the page loads nothing else).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from pipeline.broker.clients import producer
from pipeline.console.figures import version_rows
from pipeline.console.index import ConsoleIndex
from pipeline.console.reader import ReaderStatus
from pipeline.console.reviews import VERDICTS, build_review, token_ok
from pipeline.console.sample_view import ReviewForm, sample_panel
from pipeline.console.views import Page, ViewState, chosen_version, render_page, version_label
from pipeline.errors import BrokerError
from pipeline.events import Review, Sample, encode
from pipeline.settings import Settings

STATIC = Path(__file__).parent / "static"
SEND_TIMEOUT_S = 15.0


class ReviewSink:
    """Sends reviews to the ``reviews`` topic (key = sample_id), one at a time, waiting
    for the broker's acknowledgement. kafka-python's producer is thread-safe; the server
    calls :meth:`send` from worker threads (``asyncio.to_thread``)."""

    def __init__(self, settings: Settings) -> None:
        spec = settings.topics.reviews
        self.topic = spec.name
        self._producer = producer(settings, spec.max_message_bytes, linger_ms=0)

    def send(self, review: Review) -> None:
        future = self._producer.send(
            self.topic, key=review.sample_id.encode(), value=encode(review)
        )
        try:
            future.get(timeout=SEND_TIMEOUT_S)
        except Exception as exc:
            raise BrokerError(
                f"the review of {review.sample_id} was not written to {self.topic}: {exc!r}"
            ) from exc

    def close(self) -> None:
        self._producer.close(timeout=5)


@dataclass(frozen=True)
class Console:
    """What the handlers share (read-only after start-up)."""

    index: ConsoleIndex
    status: Callable[[], ReaderStatus]
    sink: ReviewSink | None  # None: read-only
    token: str | None  # a review must carry it (None: no token asked)
    pieces: Callable[[Sequence[int]], list[str]] | None = None  # token ids -> their text


CONSOLE = web.AppKey("console", Console)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def page_html(console: Console, state: ViewState) -> str:
    """The page for ``state``, from the index as it is now."""
    index = console.index
    snapshot = index.snapshot()
    versions = index.versions()
    chosen = chosen_version(state, versions)
    highest, lowest = index.extremes(chosen, state.n)
    found = index.by_session(state.session) if state.session else []
    sample = index.sample(state.sample) if state.sample else None
    panel = ""
    if sample is not None:
        pieces = (
            console.pieces(sample.response_ids) if console.pieces and sample.response_ids else None
        )
        form = ReviewForm(console.sink is not None, console.token is not None, state.url())
        session_link = state.url(session=sample.session_id, sample="")
        panel = sample_panel(sample, index.review(sample.sample_id), form, session_link, pieces)
    status = console.status()
    page = Page(
        rows=version_rows(snapshot),
        versions=versions,
        chosen=chosen,
        highest=highest,
        lowest=lowest,
        found=found,
        held=snapshot.held,
        status_ok=status.ok,
        status=status.text
        + (f"; {status.undecodable} undecodable record(s) skipped" if status.undecodable else ""),
        sample_html=panel,
        missing_sample=bool(state.sample) and sample is None,
    )
    return render_page(state, page)


async def home(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    state = ViewState.from_query(request.query, console.index.per_version)
    return web.Response(text=page_html(console, state), content_type="text/html")


async def sample_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    sample_id = request.match_info["sample_id"]
    sample = console.index.sample(sample_id)
    version = "" if sample is None else version_label(sample.policy_version)
    raise web.HTTPFound(ViewState(version=version, sample=sample_id).url())


async def api_status(request: web.Request) -> web.Response:
    return _json(asdict(request.app[CONSOLE].status()))


async def api_versions(request: web.Request) -> web.Response:
    rows = version_rows(request.app[CONSOLE].index.snapshot())
    return _json({"versions": [r.to_json() for r in rows]})


def _brief(sample: Sample) -> dict[str, Any]:
    return {"sample_id": sample.sample_id, "session_id": sample.session_id, "score": sample.score}


async def api_samples(request: web.Request) -> web.Response:
    index = request.app[CONSOLE].index
    state = ViewState.from_query(request.query, index.per_version)
    chosen = chosen_version(state, index.versions())
    highest, lowest = index.extremes(chosen, state.n)
    return _json(
        {
            "version": chosen,
            "highest": [_brief(s) for s in highest],
            "lowest": [_brief(s) for s in lowest],
        }
    )


async def api_sample(request: web.Request) -> web.Response:
    sample_id = request.match_info["sample_id"]
    sample = request.app[CONSOLE].index.sample(sample_id)
    if sample is None:
        return _error(404, f"sample {sample_id!r} is not held by this console")
    return web.Response(body=encode(sample), content_type="application/json")


async def _review_request(request: web.Request) -> tuple[dict[str, Any], bool]:
    """The POST's fields and whether it came from the page's form (not JSON)."""
    if request.content_type == "application/json":
        try:
            data = await request.json(loads=orjson.loads)
        except orjson.JSONDecodeError as exc:
            raise web.HTTPBadRequest(
                body=orjson.dumps({"error": f"the body is not valid JSON: {exc}"}),
                content_type="application/json",
            ) from exc
        return (data if isinstance(data, dict) else {}), False
    return dict(await request.post()), True


def _given_token(request: web.Request, fields: dict[str, Any]) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header.removeprefix("Bearer ").strip()
    token = fields.get("token")
    return token if isinstance(token, str) and token else None


def _verdict(value: Any) -> int | None:
    """-1, 0 or 1 from a JSON number or a form's string; None for anything else."""
    if isinstance(value, str) and value.strip() in ("-1", "0", "1", "+1"):
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and value in VERDICTS:
        return value
    return None


async def review(request: web.Request) -> web.StreamResponse:
    """Record a verdict (+1 / 0 / −1, an optional note) on a held sample onto ``reviews``."""
    console = request.app[CONSOLE]
    if console.sink is None:
        return _error(403, "this console is read-only: start it with --reviews to record verdicts")
    fields, from_form = await _review_request(request)
    if not token_ok(console.token, _given_token(request, fields)):
        return _error(
            401,
            "a review needs the console token (TURNSTREAM_CONSOLE_TOKEN, or the proxy's "
            "api_key): send it as 'Authorization: Bearer <token>' or the form's token field",
        )
    sample_id = str(fields.get("sample_id") or "")
    sample = console.index.sample(sample_id)
    if sample is None:
        return _error(404, f"sample {sample_id!r} is not held by this console")
    verdict = _verdict(fields.get("verdict"))
    if verdict is None:
        return _error(400, f"verdict must be -1, 0 or 1, got {fields.get('verdict')!r}")
    try:
        record = build_review(sample, verdict, str(fields.get("note") or ""), time.time())
        await asyncio.to_thread(console.sink.send, record)
    except ValueError as exc:
        return _error(400, str(exc))
    except BrokerError as exc:
        return _error(503, str(exc))
    console.index.add_review(record.sample_id, record)  # the reader reads it back too
    back = str(fields.get("back") or "")
    if from_form:
        safe = back.startswith("/") and not back.startswith("//")
        raise web.HTTPSeeOther(back if safe else ViewState(sample=sample_id).url())
    return _json(
        {"ok": True, "topic": console.sink.topic, "review": record.model_dump(mode="json")}
    )


def make_app(console: Console) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[CONSOLE] = console
    app.router.add_get("/", home)
    app.router.add_get("/sample/{sample_id}", sample_page)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/api/versions", api_versions)
    app.router.add_get("/api/samples", api_samples)
    app.router.add_get("/api/sample/{sample_id}", api_sample)
    app.router.add_post("/review", review)
    app.router.add_static("/static/", STATIC)
    return app
