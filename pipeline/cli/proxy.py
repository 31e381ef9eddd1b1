"""`turnstream proxy`: the capture proxy in front of a policy server."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from pipeline.errors import ConfigError
from pipeline.settings import Settings, load_settings


def settings_with_proxy(overrides: dict[str, Any]) -> Settings:
    base = load_settings()
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        proxy = type(base.proxy).model_validate({**base.proxy.model_dump(), **given})
    except ValueError as exc:
        raise ConfigError(f"invalid proxy option: {exc}") from exc
    return base.model_copy(update={"proxy": proxy})


def proxy(
    upstream: str = typer.Option(
        None, help="policy server base URL, e.g. http://127.0.0.1:30001 (TURNSTREAM_PROXY_UPSTREAM)"
    ),
    host: str = typer.Option(None, help="listen address (default 127.0.0.1)"),
    port: int = typer.Option(None, help="listen port (default 30000)"),
    default_turn_type: str = typer.Option(
        None, help="main | side: the type of a request without X-Turn-Type (default side)"
    ),
    policy_version: int = typer.Option(
        None, help="stamp this policy version (default: follow the policy.versions topic)"
    ),
    buffer: int = typer.Option(None, help="events waiting for Kafka before spooling (10000)"),
    data_dir: Path = typer.Option(None, help="session counters and spool (.turnstream/proxy)"),
    loglevel: str = typer.Option("info", help="error | warning | info | debug"),
) -> None:
    """Serve an OpenAI-compatible /v1/chat/completions that records every turn.

    Requests are forwarded to the upstream policy server (streaming passes
    through chunk by chunk); each completed response becomes a `turn` event on
    chat.turns. Send X-Session-Id, X-Turn-Type: main|side and, on the last
    request of a session, X-Session-Done: true (OpenClaw-RL's header names;
    body fields session_id / turn_type / session_done work too and are removed
    before forwarding). Auth: TURNSTREAM_PROXY_API_KEY. Every option also
    reads TURNSTREAM_PROXY_<NAME>.
    """
    from pipeline.proxy.run import run_proxy

    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_with_proxy(
        {
            "upstream": upstream,
            "host": host,
            "port": port,
            "default_turn_type": default_turn_type,
            "policy_version": policy_version,
            "buffer": buffer,
            "data_dir": data_dir,
        }
    )
    run_proxy(settings)
