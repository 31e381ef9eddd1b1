"""The `turnstream` command: one thin entry point per process over the library."""

from __future__ import annotations

import os
import sys

import typer
from kafka.errors import SaslAuthenticationFailedError
from rich.console import Console
from rich.text import Text

from pipeline.cli import (
    demo,
    kafka,
    learn,
    models,
    produce,
    proxy,
    replay,
    retry,
    rewards,
    schema,
    serve,
    topics,
    train,
    worker,
)
from pipeline.errors import TurnstreamError
from pipeline.settings import load_settings

app = typer.Typer(
    name="turnstream",
    help="Online RL from live agent conversations, decoupled through Apache Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(kafka.app, name="kafka")
app.add_typer(topics.app, name="topics")
app.add_typer(models.app, name="models")
app.add_typer(schema.app, name="schema")
app.command("produce")(produce.produce)
app.command("worker")(worker.worker)
app.command("retry")(retry.retry)
app.command("train")(train.train)
app.command("proxy")(proxy.proxy)
app.command("serve")(serve.serve)
app.command("replay")(replay.replay_cmd)
app.command("rescore")(replay.rescore_cmd)
app.add_typer(replay.offsets_app, name="offsets")
app.add_typer(rewards.reward_app, name="reward")
app.add_typer(rewards.judge_app, name="judge")
app.command("demo")(demo.demo)
app.command("learn")(learn.learn)


def _take_local_rank(argv: list[str]) -> list[str]:
    """Drop the ``--local_rank=N`` the ``deepspeed`` launcher inserts; keep it in LOCAL_RANK."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg.startswith(("--local_rank=", "--local-rank=")):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        elif arg in ("--local_rank", "--local-rank"):
            os.environ.setdefault("LOCAL_RANK", next(args, "0"))
        else:
            out.append(arg)
    return out


def main() -> None:
    sys.argv = _take_local_rank(sys.argv)
    try:
        app()
    except TurnstreamError as exc:
        _exit_with(str(exc))
    except SaslAuthenticationFailedError as exc:  # from a consumer built outside broker.clients
        from pipeline.broker.clients import authentication_failed

        _exit_with(str(authentication_failed(load_settings(), exc)))


def _exit_with(error: str) -> None:
    message = Text("error: ", style="bold red").append(error, style="")
    Console(stderr=True, soft_wrap=True).print(message, highlight=False)
    sys.exit(1)
