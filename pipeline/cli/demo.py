"""`turnstream demo`: the main job on this machine, from broker to a trained tiny policy."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from pipeline.settings import load_settings, shipped_file

if TYPE_CHECKING:
    from pipeline.demo import DemoReport

console = Console(soft_wrap=True)


def demo(
    recorded: bool = typer.Option(
        False,
        "--recorded",
        help="replay recorded sessions through a tiny random policy instead of the live loop",
    ),
    sessions: Path = typer.Option(
        None, help="--recorded: input events to send (default: the shipped example sessions)"
    ),
    keep_broker: bool = typer.Option(
        False, "--keep-broker", help="leave the local broker running afterwards"
    ),
    workdir: Path = typer.Option(
        Path(".turnstream/demo"), help="logs, state and the chart (live: a fresh trainer each run)"
    ),
    timeout: float = typer.Option(600.0, help="--recorded: seconds to wait for scoring/training"),
    with_console: bool = typer.Option(
        True, "--console/--no-console", help="live: serve `turnstream console` on the run's topics"
    ),
    console_port: int = typer.Option(
        None, help="live: the console's port (default 8080; 0: any free)", show_default=False
    ),
) -> None:
    """Run the whole pipeline here, live: the real SmolLM2-135M-Instruct served as the
    policy, simulated users talking to it through the capture proxy, the trained LLM
    judge (smollm2-135m-judge, built once), the trainer pushing each new version back to
    the server; the console on its topics (its URL printed first); live progress, then the
    held-out success and accuracy before and after, a summary table and a PNG chart
    (`turnstream learn`, shortened).

    --recorded sends the shipped example sessions through a scoring worker and a
    trainer of a tiny random model instead (no policy is served); its judge is the
    SGLang or OpenAI-compatible URL in TURNSTREAM_SCORING_JUDGE_URLS if one is set,
    else the rules judge (a deterministic heuristic).

    The broker is the local one (started if not running) unless
    KAFKA_BOOTSTRAP_SERVERS is set. Ctrl-C stops everything the demo started.
    """

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    if not recorded:
        _live(workdir, with_console, console_port)
        return
    settings = load_settings()
    sessions = sessions or shipped_file("examples/sessions.jsonl", "sessions.jsonl")
    try:
        from pipeline.demo import run_demo  # the recorded demo's stack: only when run

        report = run_demo(settings, sessions, workdir, console, keep_broker, timeout)
    except KeyboardInterrupt:
        console.print("\ninterrupted: stopped everything this demo started")
        raise typer.Exit(130) from None
    console.print(summary_table(report))
    if report.chart:
        console.print(f"chart: {report.chart}")


def _live(workdir: Path, with_console: bool, console_port: int | None) -> None:
    from pipeline.cli.learn import run_and_report
    from pipeline.learn.options import demo_options

    run_and_report(demo_options(workdir, with_console, console_port), "demo")


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
