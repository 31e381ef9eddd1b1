"""`turnstream demo`: the main job on this machine, from broker to topics."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pipeline.broker.local import LocalKafka
from pipeline.produce import TurnProducer, produce_file
from pipeline.settings import load_settings, shipped_file
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets

console = Console(soft_wrap=True)


def demo(
    sessions: Path = typer.Option(
        None, help="input events to send (default: the shipped example sessions)"
    ),
    keep_broker: bool = typer.Option(
        False, "--keep-broker", help="leave the local broker running afterwards"
    ),
) -> None:
    """Start the local broker if needed, apply topics, send example sessions, show counts."""
    settings = load_settings()
    sessions = sessions or shipped_file("examples/sessions.jsonl", "sessions.jsonl")
    started: LocalKafka | None = None
    if settings.uses_local_broker:
        local = LocalKafka(settings.local_kafka, log=console.print)
        if local.pid() is None:
            local.start()
            started = local
        else:
            console.print(f"using the running local broker at {settings.bootstrap_servers}")
    else:
        console.print(f"using the cluster at {settings.bootstrap_servers}")
    try:
        changes = admin.apply(settings)
        console.print(
            f"topics: {len(changes)} change(s) applied"
            if changes
            else "topics: already match topics.yaml"
        )
        names = [spec.name for spec in settings.topics]
        before = end_offsets(settings, names)
        with TurnProducer(settings) as producer:
            report = produce_file(sessions, producer, skip_invalid=True)
        console.print(
            f"sent {report.sent} events from {sessions}"
            + (f" ({report.dead_lettered} invalid, dead-lettered)" if report.dead_lettered else "")
        )
        after = end_offsets(settings, names)
        table = Table(title="records per topic")
        table.add_column("topic")
        table.add_column("this run", justify="right")
        table.add_column("total", justify="right")
        for name in names:
            table.add_row(name, str(after[name] - before[name]), str(after[name]))
        console.print(table)
    finally:
        if started and not keep_broker:
            started.stop()
            console.print("stopped the local broker this demo started")
