"""`turnstream demo`: the main job on this machine, from broker to a trained tiny policy."""

from __future__ import annotations

import signal
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pipeline.demo import DemoReport, run_demo
from pipeline.settings import load_settings, shipped_file

console = Console(soft_wrap=True)


def demo(
    sessions: Path = typer.Option(
        None, help="input events to send (default: the shipped example sessions)"
    ),
    keep_broker: bool = typer.Option(
        False, "--keep-broker", help="leave the local broker running afterwards"
    ),
    workdir: Path = typer.Option(Path(".turnstream/demo"), help="logs, state and the chart"),
    timeout: float = typer.Option(600.0, help="seconds to wait for scoring and training"),
) -> None:
    """Run the whole pipeline here: broker, topics, a scoring worker and a trainer,
    the example sessions, live progress, then a summary table and a PNG chart.

    The broker is the local one (started if not running) unless
    KAFKA_BOOTSTRAP_SERVERS is set. The judge is the SGLang or OpenAI-compatible
    URL in TURNSTREAM_SCORING_JUDGE_URLS if one is set, else the rules judge (a
    deterministic heuristic). The policy is a tiny random model trained on CPU.
    Ctrl-C stops everything the demo started.
    """

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    settings = load_settings()
    sessions = sessions or shipped_file("examples/sessions.jsonl", "sessions.jsonl")
    try:
        report = run_demo(settings, sessions, workdir, console, keep_broker, timeout)
    except KeyboardInterrupt:
        console.print("\ninterrupted: stopped everything this demo started")
        raise typer.Exit(130) from None
    console.print(summary_table(report))
    if report.chart:
        console.print(f"chart: {report.chart}")


def summary_table(report: DemoReport) -> Table:
    summary = Table(title="summary")
    summary.add_column("what")
    summary.add_column("count", justify="right")
    summary.add_row("events sent", str(report.sent))
    for score, n in sorted(report.scores.items()):
        summary.add_row(f"samples scored {score}", str(n))
    for reason, n in sorted(report.excluded.items()):
        summary.add_row(f"excluded: {reason}", str(n))
    for value, n in sorted(report.votes.items()):
        summary.add_row(f"judge votes {value}", str(n))
    for topic in ("samples.retry", "pipeline.deadletter"):
        added = next((n for name, n in report.added.items() if name.endswith(topic)), 0)
        summary.add_row(f"{topic} records", str(added))
    if report.steps:
        first, last = report.steps[0], report.steps[-1]
        summary.add_row("training steps", str(len(report.steps)))
        summary.add_row("samples trained", str(sum(r["samples"] for r in report.steps)))
        summary.add_row("loss (first -> last step)", f"{first['loss']:+.4f} -> {last['loss']:+.4f}")
        summary.add_row(
            "reward mean (first -> last step)",
            f"{first['reward_mean']:+.3f} -> {last['reward_mean']:+.3f}",
        )
        summary.add_row("policy version", str(last.get("policy_version", 0)))
    return summary
