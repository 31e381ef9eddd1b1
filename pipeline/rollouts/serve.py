"""A rollout processor over HTTP, as `turnstream rollout serve` runs it locally.

``POST /rollout`` with a ``RolloutInput`` as JSON answers its ``RolloutOutput``:
200 whether it is SUCCESS or FAILED (the status is in the body; a timeout or
an exception in ``process()`` is a FAILED output, see ``run_rollout``), 400
with the problems, field by field, for a body that is no ``RolloutInput``.
``GET /health`` says which processor serves and what it has done. Every other
error is a JSON body too, never a bare 500. With ``model`` overrides (a local
policy server for a task file that names a public one) each task is pointed
there first (``on_model``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from pipeline.errors import RolloutError
from pipeline.rewards.protocols import close_processor, processor_name
from pipeline.rollouts.protocols import RolloutProcessor
from pipeline.rollouts.run import on_model, rollout_input, run_rollout

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # a task with a long conversation in it


@dataclass
class RolloutService:
    """The processor served and its counts; only the event loop touches them."""

    processor: RolloutProcessor
    concurrency: int = 16
    model: dict[str, str | None] = field(default_factory=dict)  # on_model's keywords
    running: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"success": 0, "failed": 0})
    limit: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.limit = asyncio.Semaphore(self.concurrency)

    @property
    def name(self) -> str:
        return processor_name(self.processor)


SERVICE = web.AppKey("service", RolloutService)


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """An unexpected exception is a 500 that says what it was, logged with its traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:  # aiohttp's own (404, 405, 413): its text, as JSON
        text = exc.text or ""
        message = exc.reason if text.startswith(f"{exc.status}: ") or not text else text
        response = error_response(exc.status, message)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"{type(exc).__name__}: {exc}")


def build_rollout_app(
    processor: RolloutProcessor,
    concurrency: int = 16,
    model: dict[str, str | None] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> web.Application:
    """The app serving ``processor``, already set up; it is closed with the app."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_json_errors])
    app[SERVICE] = RolloutService(processor, concurrency, dict(model or {}))
    app.router.add_post("/rollout", rollout)
    app.router.add_get("/health", health)
    app.on_cleanup.append(_close)
    return app


async def rollout(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    try:
        task = on_model(rollout_input(await request.read(), "request body"), **service.model)
    except RolloutError as exc:
        return error_response(400, str(exc))
    async with service.limit:
        service.running += 1
        try:
            out = await run_rollout(service.processor, task)
        finally:
            service.running -= 1
    service.outcomes[out.status.value] = service.outcomes.get(out.status.value, 0) + 1
    body = orjson.dumps(out.model_dump(mode="json"))
    return web.Response(body=body, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {
            "status": "ok",
            "processor": service.name,
            "running": service.running,
            "concurrency": service.concurrency,
            "outcomes": service.outcomes,
        }
    )


async def _close(app: web.Application) -> None:
    await close_processor(app[SERVICE].processor)


def run_rollout_server(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` (``build_rollout_app``) until SIGINT/SIGTERM."""
    service = app[SERVICE]
    log.info(
        "rollout processor %s on http://%s:%d/rollout (%d at once)",
        service.name,
        host,
        port,
        service.concurrency,
    )
    web.run_app(
        app,
        host=host,
        port=port,
        print=lambda line: log.info("%s", line),
        access_log=None,
        shutdown_timeout=10,
    )
