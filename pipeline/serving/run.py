"""Start the embedded server: load the model and tokenizer, start the engine, listen."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from pipeline.models.fetch import resolve_model
from pipeline.serving.engine import Engine
from pipeline.serving.server import ServerState, build_server
from pipeline.serving.weights import Weights, base_of, load_model, version_of
from pipeline.settings import ModelSettings, ServeSettings

log = logging.getLogger(__name__)


def open_state(
    settings: ServeSettings, models: ModelSettings | None = None, say: Any = log.info
) -> ServerState:
    """Model, tokenizer and a started engine for ``settings.model`` (a directory or a name)."""
    import torch
    from transformers import AutoTokenizer

    if settings.threads:
        torch.set_num_threads(settings.threads)
    path = resolve_model(settings.model, models, log=say)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = load_model(path)
    context = settings.context_length or int(
        getattr(model.config, "max_position_embeddings", 0) or 4096
    )
    version = version_of(path, settings.weight_version, None)
    engine = Engine(
        Weights(model, version, str(path), base_of(path)),
        tokenizer,
        context_length=context,
        max_running=settings.max_running_requests,
        max_queued=settings.max_queued_requests,
        admit_wait_s=settings.admit_wait_ms / 1000,
        original_logprobs=settings.return_original_logprob,
        kept_tokens=settings.prefix_cache_tokens,
    )
    engine.start()
    name = settings.served_model_name or (
        settings.model if not Path(settings.model).is_dir() else path.name
    )
    names = {name, "default", settings.model, str(path)}
    return ServerState(engine, tokenizer, str(path), name, names)


def run_server(settings: ServeSettings, models: ModelSettings | None = None) -> None:
    """Serve until SIGINT/SIGTERM."""
    state = open_state(settings, models)
    log.info(
        "serving %s (weights %s, version %s) on http://%s:%d; context %d tokens, %d sequences "
        "at once",
        state.served_model_name,
        state.engine.weights.path,
        state.engine.weights.version,
        settings.host,
        settings.port,
        state.engine.context_length,
        settings.max_running_requests,
    )
    try:
        web.run_app(
            build_server(state),
            host=settings.host,
            port=settings.port,
            print=lambda line: log.info("%s", line),
            access_log=None,
            shutdown_timeout=10,
        )
    finally:
        state.engine.stop()


@contextmanager
def serving_in_thread(state: ServerState, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``state`` from a background thread (its own event loop); yields the base URL."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(build_server(state), access_log=None)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, host, port)
        loop.run_until_complete(site.start())
        box["port"] = runner.addresses[0][1]  # the port bound (port 0: the one chosen)
        box["loop"] = loop
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=main, name="serve-http", daemon=True)
    thread.start()
    ready.wait(timeout=30)
    try:
        yield f"http://{host}:{box['port']}"
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(timeout=10)
