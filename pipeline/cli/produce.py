"""`turnstream produce FILE.jsonl`: send input events to chat.turns."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from pipeline.produce import produce_file, validate_file
from pipeline.produce.jsonl import ProduceReport
from pipeline.settings import load_settings

console = Console(stderr=True, soft_wrap=True)


def _progress(label: str, total: int) -> tuple[Progress, TaskID]:
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )
    return bar, bar.add_task(label, total=total)


def _report_errors(report: ProduceReport, path: Path) -> None:
    for err in report.errors:
        console.print(f"{path}:{err}", highlight=False, markup=False)


def produce(
    file: Path = typer.Argument(
        ...,
        exists=True,
        dir_okay=False,
        readable=True,
        help="JSON Lines, one input event (turn/message/session_end) a line",
    ),
    skip_invalid: bool = typer.Option(
        False,
        "--skip-invalid",
        help="send the valid lines and dead-letter the invalid ones (default: send nothing "
        "if any line is invalid)",
    ),
) -> None:
    """Validate FILE and send its events to chat.turns, keyed by session_id."""
    settings = load_settings()
    size = file.stat().st_size
    max_bytes = settings.topics.chat_turns.max_message_bytes
    if not skip_invalid:
        bar, task = _progress("validating", size)
        with bar:
            report = validate_file(file, max_bytes, lambda n: bar.advance(task, n))
        if report.errors:
            _report_errors(report, file)
            console.print(
                f"[red]{len(report.errors)} invalid line(s), {report.valid} valid; "
                "nothing was sent[/] (use --skip-invalid to send the valid ones and "
                "dead-letter the rest)"
            )
            raise typer.Exit(1)
    bar, task = _progress("sending", size)
    with bar:
        report = produce_file(
            file,
            settings,
            skip_invalid,
            lambda n: bar.advance(task, n),
            validated=not skip_invalid,
        )
    _report_errors(report, file)
    topics = settings.topics
    console.print(
        f"sent {report.sent} event(s) to {topics.chat_turns.name}"
        + (
            f"; {report.dead_lettered} invalid line(s) sent to {topics.deadletter.name}"
            if report.dead_lettered
            else ""
        ),
        highlight=False,
    )
