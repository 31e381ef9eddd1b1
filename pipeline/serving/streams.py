"""From the engine thread to an HTTP answer: a Ticket per job, and the SSE streams."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from pipeline.serving import native, openai_chat
from pipeline.serving.jobs import Event, Job
from pipeline.serving.openai_chat import ChatCall
from pipeline.serving.sampling import BadRequest

VERSION_HEADER = "X-Weight-Version"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Ticket:
    """A job's events, handed from the engine thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.job: Job | None = None

    def emit(self, event: Event) -> None:
        """Called on the engine thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is gone: shutting down
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    async def next(self) -> Event:
        try:
            event = await self.events.get()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if event.kind == "error":
            raise BadRequest(f"generation failed: {event.error}", status=500)
        return event

    async def finished(self) -> None:
        """Wait for the job's end (its result is on ``job``)."""
        try:
            while (await self.next()).kind != "done":
                pass
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        if self.job is not None and self.job.finish is None:
            self.job.cancelled = True


def _sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _open(request: web.Request, version: str) -> web.StreamResponse:
    response = web.StreamResponse(headers={**SSE_HEADERS, VERSION_HEADER: version})
    await response.prepare(request)
    return response


async def stream_generate(
    request: web.Request,
    submitted: tuple[Job, Ticket],
    rid: str,
    text: Callable[[int], str] | None,
    started: float,
) -> web.StreamResponse:
    """SGLang's /generate stream: each event is the whole answer so far, then [DONE]."""
    job, ticket = submitted
    event = await ticket.next()
    response = await _open(request, job.version)
    shown = ""
    try:
        while True:
            elapsed = time.perf_counter() - started
            if event.kind == "done":
                await response.write(_sse(native.answer(job, rid, text, elapsed)))
                break
            shown += event.delta
            await response.write(_sse(native.answer(job, rid, text, elapsed, partial=shown)))
            event = await ticket.next()
    except BadRequest as exc:
        await response.write(_sse({"error": {"message": str(exc), "code": exc.status}}))
    except ConnectionResetError:
        ticket.cancel()
        return response
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def stream_chat(
    request: web.Request, call: ChatCall, ticket: Ticket, text: Callable[[int], str]
) -> web.StreamResponse:
    """OpenAI chat chunks: the role, one chunk per token, the finish, usage, [DONE]."""
    assert ticket.job is not None
    job = ticket.job
    event = await ticket.next()
    response = await _open(request, job.version)
    head = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    extra = {"prompt_token_ids": job.request.prompt_ids} if call.token_ids else {}
    try:
        await response.write(_sse(openai_chat.chunk(call, head, **extra)))
        sent = 0
        while event.kind != "done":
            if event.delta or call.logprobs or call.token_ids:
                await response.write(_sse(_token_chunk(call, job, sent, event, text)))
            sent += 1
            event = await ticket.next()
        await response.write(_sse(_finish_chunk(call, job)))
        if call.include_usage:
            await response.write(_sse(openai_chat.chunk(call, None, usage=openai_chat.usage(job))))
    except BadRequest as exc:
        error = {
            "object": "error",
            "message": str(exc),
            "type": "InternalServerError",
            "param": None,
            "code": exc.status,
        }
        await response.write(_sse({"error": error}))
    except ConnectionResetError:
        ticket.cancel()
        return response
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _token_chunk(
    call: ChatCall, job: Job, index: int, event: Event, text: Callable[[int], str]
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "delta": {"content": event.delta},
        "logprobs": {"content": openai_chat.logprob_entries(job, index, index + 1, text)}
        if call.logprobs
        else None,
        "finish_reason": None,
    }
    if call.token_ids:
        choice["token_ids"] = [event.token]
    return openai_chat.chunk(call, choice)


def _finish_chunk(call: ChatCall, job: Job) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": openai_chat.finish_reason(job),
        "matched_stop": (job.finish or {}).get("matched"),
    }
    return openai_chat.chunk(call, choice, metadata={"weight_version": job.version})
