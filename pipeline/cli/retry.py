"""`turnstream retry`: judge again the pairs whose judge calls failed."""

from __future__ import annotations

import typer

from pipeline.settings import load_settings


def retry(
    max_attempts: int = typer.Option(5, help="dead-letter a pair after this many failures"),
) -> None:
    """Move samples.retry back to turns.paired (up to its current end), then stop."""
    from pipeline.scoring.retry import requeue  # the scoring stack: only when run

    report = requeue(load_settings(), max_attempts=max_attempts)
    typer.echo(
        f"requeued {report.requeued} pair(s) to turns.paired; dead-lettered {report.dead_lettered}"
    )
