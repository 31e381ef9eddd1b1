"""`turnstream demo`: the main job on this machine, from broker to scored samples."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pipeline.demo import run_demo
from pipeline.settings import load_settings, shipped_file

console = Console(soft_wrap=True)


def demo(
    sessions: Path = typer.Option(
        None, help="input events to send (default: the shipped example sessions)"
    ),
    keep_broker: bool = typer.Option(
        False, "--keep-broker", help="leave the local broker running afterwards"
    ),
    workdir: Path = typer.Option(Path(".turnstream/demo"), help="logs and worker state"),
    timeout: float = typer.Option(300.0, help="seconds to wait for scoring to catch up"),
) -> None:
    """Start the local broker if needed, apply topics, run a scoring worker, send the
    example sessions, and show what each stage produced.

    The judge is the SGLang or OpenAI-compatible URL in TURNSTREAM_SCORING_JUDGE_URLS
    if one is set, else the rules judge (a deterministic heuristic).
    """
    settings = load_settings()
    sessions = sessions or shipped_file("examples/sessions.jsonl", "sessions.jsonl")
    report = run_demo(settings, sessions, workdir, console, keep_broker, timeout)
    summary = Table(title="summary")
    summary.add_column("what")
    summary.add_column("count", justify="right")
    summary.add_row("events sent", str(report.sent))
    for score, n in sorted(report.scores.items()):
        summary.add_row(f"samples scored {score}", str(n))
    for reason, n in sorted(report.excluded.items()):
        summary.add_row(f"excluded: {reason}", str(n))
    if report.steps:
        first, last = report.steps[0], report.steps[-1]
        summary.add_row("training steps", str(len(report.steps)))
        summary.add_row("samples trained", str(sum(r["samples"] for r in report.steps)))
        summary.add_row("loss (first -> last step)", f"{first['loss']:+.4f} -> {last['loss']:+.4f}")
        summary.add_row("policy version", str(last.get("policy_version", 0)))
    console.print()
    console.print(summary)
