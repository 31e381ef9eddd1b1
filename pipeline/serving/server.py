"""`turnstream serve`: a policy server on CPU that speaks SGLang's HTTP protocol.

Matched against SGLang 0.5.23 (the PyPI wheel sglang-0.5.23, its
``srt/entrypoints/http_server.py``, ``srt/managers/io_struct.py``,
``srt/managers/tokenizer_manager.py`` and ``srt/entrypoints/openai/protocol.py``):
``POST /generate``, ``POST /v1/chat/completions`` (streamed or not),
``GET /v1/models``, ``GET /health``, ``GET /health_generate``,
``GET /get_model_info`` (``/model_info``) and ``POST /update_weights_from_disk``.
Where this server differs: an unknown ``model`` is a 404 (SGLang ignores it);
only text is served; no LoRA, penalties or structural tags (a request for them is a
400). Grammars (``regex``, ``json_schema``, ``ebnf``; chat: ``response_format``) are
compiled with xgrammar, SGLang's grammar backend, in a worker thread.
Every generation answer carries the weight version that produced it, in
``meta_info.weight_version`` (chat: ``metadata.weight_version``) and the
``X-Weight-Version`` header. ``/update_weights_from_disk`` also takes a delta (the
tensors that train, on the served weights: :mod:`pipeline.serving.weights`), which
SGLang does not; its answer says so (``weight_deltas``), and a delta for other
weights than the served ones is a 409.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from pipeline.models.convert import ModelError
from pipeline.models.fetch import read_judge_manifest
from pipeline.serving import native, openai_chat
from pipeline.serving.engine import Engine
from pipeline.serving.jobs import Job, Request
from pipeline.serving.sampling import BadRequest, Sampling
from pipeline.serving.streams import VERSION_HEADER, Ticket, stream_chat, stream_generate
from pipeline.serving.weights import (
    BaseMismatch,
    Weights,
    apply_delta,
    base_of,
    is_delta,
    load_model,
    version_of,
)

log = logging.getLogger(__name__)
LOAD_FORMATS = (None, "auto", "safetensors")


@dataclass
class ServerState:
    engine: Engine
    tokenizer: Any
    tokenizer_path: str
    served_model_name: str
    names: set[str]
    push_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: float = field(default_factory=time.time)
    pushes: int = 0
    last_push: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.token_text = lru_cache(maxsize=65536)(
            lambda i: self.tokenizer.decode(
                [i], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def render(
        self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
    ) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("the served model has no chat template; use /generate")
        try:
            prompt = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
            )
        except Exception as exc:  # jinja's TemplateError and friends: the messages do not fit
            raise BadRequest(f"the chat template cannot render these messages: {exc}") from exc
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))


STATE = web.AppKey("state", ServerState)


def openai_error(status: int, message: str, param: str | None = None) -> web.Response:
    kind = {404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "BadRequestError")
    body = {"object": "error", "message": message, "type": kind, "param": param, "code": status}
    return web.json_response(body, status=status)


def native_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


@web.middleware
async def errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every failure is a JSON answer: 4xx for the request's fault, 500 without a traceback."""
    chat = request.path.startswith("/v1/")
    try:
        response: web.StreamResponse = await handler(request)
    except BadRequest as exc:
        response = (
            openai_error(exc.status, str(exc), exc.param)
            if chat
            else native_error(exc.status, str(exc))
        )
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("%s %s failed", request.method, request.path)
        message = f"internal error: {type(exc).__name__}"
        response = openai_error(500, message) if chat else native_error(500, message)
    if VERSION_HEADER not in response.headers and not response.prepared:
        response.headers[VERSION_HEADER] = request.app[STATE].engine.weights.version
    return response


async def _body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc


def _submit(
    state: ServerState, requests: list[Request], compiled: dict[Any, Any]
) -> list[tuple[Job, Ticket]]:
    """Queue ``requests`` together (``compiled``: their grammars); a ticket for each."""
    loop = asyncio.get_running_loop()
    tickets = [Ticket(loop) for _ in requests]
    items = [
        (r, t.emit, compiled.get(r.sampling.grammar))
        for r, t in zip(requests, tickets, strict=True)
    ]
    jobs = state.engine.submit_all(items)
    for job, ticket in zip(jobs, tickets, strict=True):
        ticket.job = job
    return list(zip(jobs, tickets, strict=True))


async def _compile_grammars(state: ServerState, requests: list[Request]) -> dict[Any, Any]:
    """Each distinct grammar of ``requests``, compiled in a worker thread so that the event
    loop goes on serving (a regex or a small JSON schema takes about 7 ms on a 49k
    vocabulary; the first grammar also indexes the vocabulary, about 0.2 s)."""
    loop = asyncio.get_running_loop()
    grammars = {g for r in requests if (g := r.sampling.grammar) is not None}
    compile_ = state.engine.grammars.compile
    return {key: await loop.run_in_executor(None, compile_, *key) for key in grammars}


async def generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    call = native.parse_generate(await _body(request), state.tokenize)
    for item in call.requests:
        state.engine.check(item)  # refuse the whole batch before any of it runs
    started = time.perf_counter()
    compiled = await _compile_grammars(state, call.requests)
    text = state.token_text if call.text_in_logprobs else None
    tickets = _submit(state, call.requests, compiled)
    rids = [str(rid) if rid else uuid.uuid4().hex for rid in call.rids]
    if call.stream:
        return await stream_generate(request, tickets[0], rids[0], text, started)
    answers = []
    for (job, ticket), rid in zip(tickets, rids, strict=True):
        await ticket.finished()
        answers.append(native.answer(job, rid, text, time.perf_counter() - started))
    payload = answers if call.batch else answers[0]
    versions = ",".join(sorted({job.version for job, _ in tickets}))
    return web.json_response(payload, dumps=_dumps, headers={VERSION_HEADER: versions})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    call = openai_chat.parse_chat(await _body(request), state.names, state.render)
    compiled = await _compile_grammars(state, [call.request])
    [(job, ticket)] = _submit(state, [call.request], compiled)
    if call.stream:
        return await stream_chat(request, call, ticket, state.token_text)
    await ticket.finished()
    body = openai_chat.completion(call, job, state.token_text)
    return web.json_response(body, dumps=_dumps, headers={VERSION_HEADER: job.version})


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    card = {
        "id": state.served_model_name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "turnstream",
        "root": state.engine.weights.path,
        "max_model_len": state.engine.context_length,
    }
    return web.json_response({"object": "list", "data": [card]})


async def health(_request: web.Request) -> web.Response:
    return web.Response(status=200)


async def health_generate(request: web.Request) -> web.Response:
    """SGLang's deep health check: one greedy token must come out."""
    state = request.app[STATE]
    [(_job, ticket)] = _submit(
        state, [Request([0], Sampling(max_new_tokens=1, temperature=0.0))], {}
    )
    try:
        await asyncio.wait_for(ticket.finished(), timeout=20)
    except (TimeoutError, RuntimeError):
        return web.Response(status=503)
    return web.Response(status=200)


async def model_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    weights = state.engine.weights
    config = weights.model.config
    return web.json_response(
        {
            "model_path": weights.path,
            "tokenizer_path": state.tokenizer_path,
            "served_model_name": state.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": weights.version,
            "weights_loaded_at": weights.loaded_at,
            "weights_base": weights.base,  # what a delta push must name (serving.weights)
            "load_format": "auto",
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
            "context_length": state.engine.context_length,
            "pushes": state.pushes,
            "last_push": state.last_push,
            "load": state.engine.load(),
            "turnstream_judge": _judge_facts(weights.path),
        }
    )


def _judge_facts(path: str) -> dict[str, Any] | None:
    """What a judge trained by `turnstream judge train` says of itself (None: no such judge);
    a judge client with judge_constrained=auto constrains its votes when this is set."""
    manifest = read_judge_manifest(Path(path))
    if manifest is None:
        return None
    keys = ("base", "prompt_version", "steps", "trained_at")
    return {key: manifest.get(key) for key in keys}


async def update_weights_from_disk(request: web.Request) -> web.Response:
    """Load new weights beside the served ones, then serve them to new requests."""
    state = request.app[STATE]
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
        return _push_answer(False, "model_path (a checkpoint directory) is required", 400)
    if body.get("load_format") not in LOAD_FORMATS:
        return _push_answer(False, f"load_format {body['load_format']!r} is not supported", 400)
    if body.get("abort_all_requests"):
        return _push_answer(False, "abort_all_requests is not supported: requests finish", 400)
    path = Path(body["model_path"])
    given = body.get("weight_version")
    async with state.push_lock:
        started = time.perf_counter()
        served = state.engine.weights
        try:
            version = version_of(path, None if given is None else str(given), served.version)
            weights = await asyncio.get_running_loop().run_in_executor(
                None, _load, path, served, version
            )
        except ModelError as exc:
            log.warning("weight update from %s refused: %s", path, exc)
            return _push_answer(False, str(exc), 409 if isinstance(exc, BaseMismatch) else 400)
        state.engine.swap(weights)
        seconds = time.perf_counter() - started
        state.pushes += 1
        state.last_push = {
            "path": str(path),
            "version": version,
            "load_s": round(seconds, 3),
            "at": time.time(),
        }
    log.info("serving weights %s from %s (loaded in %.2fs)", version, path, seconds)
    return _push_answer(
        True,
        f"Succeeded to update model weights. Weight version updated to {version}.",
        200,
        weight_version=version,
        load_s=round(seconds, 3),
        weight_deltas=True,  # this server also takes deltas on these weights (serving.weights)
        base=weights.base,
    )


def _load(path: Path, served: Weights, version: str) -> Weights:
    """The weights at ``path``: a delta on the served ones, or a whole checkpoint."""
    if is_delta(path):
        return Weights(apply_delta(path, served), version, str(path), served.base)
    return Weights(load_model(path, served.model), version, str(path), base_of(path))


def _push_answer(success: bool, message: str, status: int, **extra: Any) -> web.Response:
    body = {"success": success, "message": message, "num_paused_requests": 0, **extra}
    return web.json_response(body, status=status)


def _dumps(data: Any) -> str:
    return orjson.dumps(data).decode()


def build_server(state: ServerState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[errors])
    app[STATE] = state
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/generate", generate)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    return app
