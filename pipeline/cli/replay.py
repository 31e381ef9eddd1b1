"""`turnstream replay` and `turnstream offsets show|reset`: the log as a replayable record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline.replay.copy import ReplayReport, replay, replay_id_for
from pipeline.replay.ranges import RangeRequest
from pipeline.settings import Settings, load_settings

console = Console(soft_wrap=True)
offsets_app = typer.Typer(help="Show or move a consumer group's offsets.", no_args_is_help=True)


def physical(settings: Settings, name: str) -> str:
    """A logical name from topics.yaml (chat.turns) becomes its real name; others stay."""
    specs = {spec.logical: spec.name for spec in settings.topics}
    return specs.get(name, name)


def _columns() -> tuple[Any, ...]:
    return (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]} rec/s"),
        TimeElapsedColumn(),
    )


SINCE = typer.Option(None, help="start time: ISO 8601 (UTC if no zone) or epoch ms")
UNTIL = typer.Option(None, help="end time (exclusive), same forms as --since")
PARTITIONS = typer.Option(None, help="only these partitions, e.g. 0,3")


def replay_cmd(
    source: str = typer.Option(..., "--from", help="topic to read (logical or real name)"),
    target: str = typer.Option(..., "--to", help="topic to write; it must exist"),
    since: str = SINCE,
    until: str = UNTIL,
    start_offsets: str = typer.Option(None, help="PARTITION:OFFSET,... to start at"),
    end_offsets: str = typer.Option(None, help="PARTITION:OFFSET,... to stop before"),
    partitions: str = PARTITIONS,
    replay_id: str = typer.Option(None, help="name this replay (default: a hash of the range)"),
    processes: int = typer.Option(
        0, min=0, help="processes that copy, partitions shared (0: 2 with two cores or more)"
    ),
) -> None:
    """Copy a range of one topic into another, keeping keys, headers and timestamps.

    The range is resolved per partition when the command starts and the copy
    stops at its end. Running the same replay again adds nothing: copies carry
    a replay id and their source in headers, and the target is checked first.
    """
    settings = load_settings()
    request = RangeRequest(since, until, start_offsets, end_offsets, partitions)
    topic, to = physical(settings, source), physical(settings, target)
    bar = Progress(*_columns(), console=console, transient=False)
    task = bar.add_task("replay", total=None, rate="-", start=False)

    def show(report: ReplayReport) -> None:
        if report.span is not None and not bar.tasks[task].started:  # the range is resolved
            console.print(
                f"replaying {report.total} record(s) of {topic} {report.span.describe()} into {to}"
            )
            bar.start()
            bar.start_task(task)
            bar.update(task, total=report.total or 1, completed=0 if report.total else 1)
        if report.total:
            done = report.copied + report.already_there
            bar.update(task, completed=done, rate=f"{report.rate:,.0f}")

    rid = replay_id or replay_id_for(topic, to, **request.options())
    try:
        report = replay(
            settings, topic, request, to, replay_id=rid, progress=show, processes=processes or None
        )
    finally:
        bar.stop()
    console.print(
        f"replay {report.replay_id}: copied {report.copied}, already in {to} "
        f"{report.already_there}, in {report.seconds:.1f}s ({report.rate:,.0f} records/s)"
    )


@offsets_app.command("show")
def show(
    group: str = typer.Option(..., help="consumer group id (as on the broker)"),
    topic: list[str] = typer.Option(None, help="also show these topics (logical or real name)"),
) -> None:
    """Committed offset, end offset and lag per partition, and the group's members."""
    from pipeline.replay import group_offsets

    settings = load_settings()
    view = group_offsets.describe(settings, group, [physical(settings, t) for t in topic or []])
    console.print(f"group {view.group}: {view.state}, {len(view.members)} member(s)")
    for member in view.members:
        console.print(f"  {member}", highlight=False)
    table = Table()
    for column in ("topic", "partition", "committed", "end", "lag"):
        table.add_column(column, justify="left" if column == "topic" else "right")
    for pos in view.positions:
        table.add_row(
            pos.topic,
            str(pos.partition),
            "-" if pos.committed is None else str(pos.committed),
            str(pos.end),
            "-" if pos.lag is None else str(pos.lag),
        )
    console.print(table)


@offsets_app.command("reset")
def reset(
    group: str = typer.Option(..., help="consumer group id"),
    topic: str = typer.Option(..., help="topic whose offsets move (logical or real name)"),
    to_time: str = typer.Option(None, help="first record at or after this time"),
    to_offset: str = typer.Option(None, help="PARTITION:OFFSET,... explicitly"),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="the start of the log"),
    to_latest: bool = typer.Option(False, "--to-latest", help="the end of the log"),
    partitions: str = PARTITIONS,
) -> None:
    """Move a group's committed offsets. Refused while the group has active members."""
    from pipeline.replay import group_offsets

    settings = load_settings()
    name = physical(settings, topic)
    moved = group_offsets.reset(
        settings, group, name, to_time, to_offset, to_earliest, to_latest, partitions
    )
    for partition, offset in sorted(moved.items()):
        console.print(f"{group} {name}[{partition}] -> {offset}", highlight=False)


def rescore_cmd(
    judge_config: Path = typer.Option(
        ..., help="YAML of scoring options for the new judge (judge, judge_urls, m, ...)"
    ),
    output_topic: str = typer.Option(
        "samples.scored.v2", help="where the new samples go (created like samples.scored)"
    ),
    source: str = typer.Option("turns.paired", "--from", help="pairs to judge again"),
    since: str = SINCE,
    until: str = UNTIL,
    start_offsets: str = typer.Option(None, help="PARTITION:OFFSET,... to start at"),
    end_offsets: str = typer.Option(None, help="PARTITION:OFFSET,... to stop before"),
    partitions: str = PARTITIONS,
) -> None:
    """Judge a range of turns.paired again with another judge, into another topic.

    Live consumers are untouched: the rescore has its own consumer group (one
    per range, judge config and output), commits its progress, and resumes
    when run again. An unreachable judge stops it with the progress kept.
    """
    from pipeline.replay.rescore import RescoreReport, judge_settings, rescore

    settings = judge_settings(load_settings(), judge_config)
    request = RangeRequest(since, until, start_offsets, end_offsets, partitions)
    span = request.resolve(settings, physical(settings, source))
    prefix = settings.topic_prefix  # the output lives in the same namespace as the topics
    out = output_topic if output_topic.startswith(prefix) else prefix + output_topic
    s = settings.scoring
    # The request, not the offsets it resolves to: running it again resumes.
    run_id = replay_id_for(span.topic, out, **request.options(), judge=judge_config.read_text())
    group = f"{settings.topic_prefix}turnstream-rescore.{run_id}"
    console.print(
        f"rescoring {span.total} pair(s) of {span.topic} {span.describe()} into {out} "
        f"with judge={s.judge} m={s.m} vote_mode={s.vote_mode} mode={s.mode} (group {group})"
    )
    with Progress(*_columns(), console=console, transient=False) as bar:
        task = bar.add_task("rescore", total=span.total or 1, rate="-")

        def show(report: RescoreReport) -> None:
            done = report.already_done + report.scored + report.dead_lettered
            rate = (report.scored + report.dead_lettered) / report.seconds if report.seconds else 0
            bar.update(task, completed=done, rate=f"{rate:,.0f}")

        report = rescore(settings, span, out, group, progress=show)
        if span.total == 0:
            bar.update(task, completed=1)
    console.print(
        f"rescored {report.scored} sample(s) into {out} ({report.already_done} done before, "
        f"{report.dead_lettered} dead-lettered) in {report.seconds:.1f}s"
    )
