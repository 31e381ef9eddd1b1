"""`turnstream console`: a web page over the live topics, and human reviews of samples."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from pipeline.errors import ConfigError
from pipeline.settings import Settings, load_settings


def settings_with_console(overrides: dict[str, Any]) -> Settings:
    base = load_settings()
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        console = type(base.console).model_validate({**base.console.model_dump(), **given})
    except ValueError as exc:
        raise ConfigError(f"invalid console option: {exc}") from exc
    return base.model_copy(update={"console": console})


def console(
    host: str = typer.Option(None, help="listen address (default 127.0.0.1)"),
    port: int = typer.Option(None, help="listen port (default 8080)"),
    reviews: bool = typer.Option(
        False, "--reviews", help="record verdicts on the reviews topic (implied by a token)"
    ),
    tokenizer: Path = typer.Option(
        None,
        help="the policy's tokenizer, to show OPD tokens as text "
        "(default TURNSTREAM_SCORING_POLICY_TOKENIZER; without one: token ids)",
    ),
    loglevel: str = typer.Option("warning", help="error | warning | info | debug"),
) -> None:
    """Serve a page over samples.scored, policy.versions and reviews, read live.

    Per policy version: the train reward, held-out accuracy when published, response
    length, entropy, KL, vote agreement, excluded share and the judge's length bias,
    with the divergence flag; each version's highest and lowest scored samples, a
    search by session id, and each sample with its prompt, response, next state,
    votes, hint, loss mask and (OPD) per-token teacher − rollout advantage. The
    view is in the URL. Read-only unless --reviews or TURNSTREAM_CONSOLE_TOKEN
    (else the proxy's api_key) is set; a review then needs that token, and
    `turnstream judge agreement --from-reviews` scores the judge against the
    reviews. Every option also reads TURNSTREAM_CONSOLE_<NAME>.
    """
    from pipeline.console.run import run_console

    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_with_console({"host": host, "port": port})
    pieces_from = tokenizer or settings.scoring.policy_tokenizer
    run_console(settings, settings.console.host, settings.console.port, reviews, pieces_from)
