"""`turnstream serve`: the embedded policy server (SGLang's HTTP protocol, on CPU)."""

from __future__ import annotations

import logging
from typing import Any

import typer

from pipeline.errors import ConfigError
from pipeline.settings import ServeSettings, load_settings


def settings_with_serve(overrides: dict[str, Any]) -> tuple[ServeSettings, Any]:
    base = load_settings()
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        serve = ServeSettings.model_validate({**base.serve.model_dump(), **given})
    except ValueError as exc:
        raise ConfigError(f"invalid serve option: {exc}") from exc
    return serve, base.models


def serve(
    model: str = typer.Option(
        None, help="HF checkpoint directory or a model name (default smollm2-135m-instruct)"
    ),
    host: str = typer.Option(None, help="listen address (default 127.0.0.1)"),
    port: int = typer.Option(None, help="listen port (default 30001)"),
    served_model_name: str = typer.Option(None, help="the model name clients send"),
    weight_version: str = typer.Option(None, help="version of the weights at start"),
    context_length: int = typer.Option(None, help="prompt + new tokens (default: the model's)"),
    max_running_requests: int = typer.Option(None, help="sequences decoded together (16)"),
    threads: int = typer.Option(None, help="torch CPU threads"),
    prefix_cache_tokens: int = typer.Option(
        None, help="tokens of prompts and answers kept for the turns that start with them (8192)"
    ),
    loglevel: str = typer.Option("info", help="error | warning | info | debug"),
) -> None:
    """Serve a causal LM on CPU with SGLang's HTTP protocol.

    POST /generate, POST /v1/chat/completions (streamed or not), GET /v1/models,
    GET /health, GET /get_model_info and POST /update_weights_from_disk: the same
    URLs and shapes as an SGLang server, so turnstream's clients (the capture
    proxy, the judge, the OPD teacher, the trainer's weight push) talk to either.
    Concurrent requests are batched; a weight update never pauses serving. A
    model name is fetched and converted on first use (`turnstream models fetch`).
    Every option also reads TURNSTREAM_SERVE_<NAME>.
    """
    from pipeline.serving.run import run_server

    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings, models = settings_with_serve(
        {
            "model": model,
            "host": host,
            "port": port,
            "served_model_name": served_model_name,
            "weight_version": weight_version,
            "context_length": context_length,
            "max_running_requests": max_running_requests,
            "threads": threads,
            "prefix_cache_tokens": prefix_cache_tokens,
        }
    )
    run_server(settings, models)
