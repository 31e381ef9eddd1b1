"""The `turnstream` command: one thin entry point per process over the library."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.text import Text

from pipeline.cli import demo, kafka, produce, retry, schema, topics, train, worker
from pipeline.errors import TurnstreamError

app = typer.Typer(
    name="turnstream",
    help="Online RL from live agent conversations, decoupled through Apache Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(kafka.app, name="kafka")
app.add_typer(topics.app, name="topics")
app.add_typer(schema.app, name="schema")
app.command("produce")(produce.produce)
app.command("worker")(worker.worker)
app.command("retry")(retry.retry)
app.command("train")(train.train)
app.command("demo")(demo.demo)


def main() -> None:
    try:
        app()
    except TurnstreamError as exc:
        message = Text("error: ", style="bold red").append(str(exc), style="")
        Console(stderr=True, soft_wrap=True).print(message, highlight=False)
        sys.exit(1)
