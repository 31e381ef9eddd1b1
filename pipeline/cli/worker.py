"""`turnstream worker`: one scoring worker (pair -> judge -> mask)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pipeline.errors import ConfigError
from pipeline.settings import Settings, load_settings


def scoring_overrides(
    judge: str | None,
    judge_url: list[str] | None,
    mode: str | None,
    vote_mode: str | None,
    m: int | None,
    **extra: Any,
) -> dict[str, Any]:
    given = {
        "judge": judge,
        "judge_urls": judge_url or None,
        "mode": mode,
        "vote_mode": vote_mode,
        "m": m,
        **extra,
    }
    return {k: v for k, v in given.items() if v is not None}


def settings_with_scoring(overrides: dict[str, Any]) -> Settings:
    """Settings whose scoring section has the command-line flags applied on top."""
    from pydantic import ValidationError

    base = load_settings()
    scoring = base.scoring.model_copy(update=overrides)
    try:
        checked = type(base.scoring).model_validate(scoring.model_dump())
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ConfigError(f"invalid scoring settings: {problems}") from exc
    return base.model_copy(update={"scoring": checked})


TEACHER_URL_HELP = (
    "opd/combine: SGLang /generate base URL of the teacher (asked for the log-probs of each "
    "response under its hinted prompt); repeat once per replica (default: the judge's)"
)


def worker(
    judge: str = typer.Option(None, help="rules | sglang | openai (default: rules)"),
    judge_url: list[str] = typer.Option(None, help="judge base URL; repeat once per replica"),
    teacher_url: list[str] = typer.Option(None, help=TEACHER_URL_HELP),
    mode: str = typer.Option(None, help="rl | opd | combine (default: rl)"),
    vote_mode: str = typer.Option(None, help="fixed | early_stop (default: fixed)"),
    m: int = typer.Option(None, help="eval votes per turn (default: 3)"),
    web_host: str = typer.Option(
        None, help="Prometheus /metrics listen address; 0.0.0.0 = every interface (127.0.0.1)"
    ),
    web_port: int = typer.Option(None, help="Prometheus /metrics port; 0 = off (default 6066)"),
    data_dir: Path = typer.Option(None, help="this worker's local state directory"),
    loglevel: str = typer.Option("info", help="crit | error | warn | info | debug"),
) -> None:
    """Run a scoring worker: chat.turns -> turns.paired -> samples.scored.

    Flags override TURNSTREAM_SCORING_* settings. Start several workers (each
    with its own --web-port and --data-dir) to split the partitions.
    """
    from pipeline.scoring.worker import run_worker

    overrides = scoring_overrides(
        judge,
        judge_url,
        mode,
        vote_mode,
        m,
        teacher_urls=teacher_url or None,
        web_host=web_host,
        web_port=web_port,
        data_dir=data_dir,
    )
    settings = settings_with_scoring(overrides)
    s = settings.scoring
    typer.echo(
        f"scoring worker: judge={s.judge}"
        + (
            " (deterministic heuristic judge, no model)"
            if s.judge == "rules"
            else f" urls={list(s.judge_urls)}"
        )
        + f" mode={s.mode} vote_mode={s.vote_mode} m={s.m} "
        + (f"teacher={list(s.teacher_urls)} " if s.mode != "rl" and s.teacher_urls else "")
        + (f"rewards={s.rewards} " if s.rewards else "")
        + ("consumer=thread " if s.consumer_thread else "")
        + f"kafka={settings.bootstrap_servers}",
        err=True,
    )
    run_worker(settings, loglevel=loglevel)
