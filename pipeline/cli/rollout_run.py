"""`turnstream rollout run`: tasks from a file, or from a topic, through a rollout processor
and the capture proxy; `turnstream rollout submit`: a task file onto rollout.tasks.

Exit status of `rollout run`: 0 when every task succeeded, 1 when some were dead-lettered
(or Kafka or the proxy could not be used), 2 when the processor, the task file or the
options cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import typer

from pipeline.cli.output import fail
from pipeline.errors import ConfigError, RolloutError

PROCESSOR_HELP = (
    "the rollout processor class: package.module:Class, package.module.Class or "
    "path/to/file.py:Class"
)
RUN_ID_HELP = (
    "names this run's sessions, rollout:RUN:TASK:INDEX:ATTEMPT (1 to 24 letters, digits, "
    "'.', '_', '-'; default: 8 random hex digits, new each time the command starts)"
)
MODEL_URL_HELP = (
    "the capture proxy's OpenAI base URL, e.g. http://127.0.0.1:30000/v1: each attempt's "
    "model_resource.base_url becomes its rollout route there"
)
TASKS_HELP = "a JSONL file, one RolloutInput a line (or --topic)"
TOPIC_HELP = (
    "take tasks from this topic of topics.yaml, e.g. rollout.tasks, one RolloutInput a "
    "record, as a member of --group; runs until stopped (or --until-end)"
)
GROUP_HELP = (
    "with --topic: the consumer group; the processes of one group share the topic's "
    "partitions (default: turnstream-rollouts, after TURNSTREAM_TOPIC_PREFIX)"
)
UNTIL_END_HELP = (
    "with --topic: stop once the group has finished and committed every task that was on "
    "the topic when the command started"
)
IN_FLIGHT_HELP = "with --topic: tasks taken and not yet finished, at most (default: --concurrency)"
ATTEMPTS_HELP = "tries of each rollout before its task is dead-lettered"
DEFAULT_GROUP = "turnstream-rollouts"
TASKS = typer.Option(None, "--tasks", help=TASKS_HELP)
TOPIC = typer.Option(None, "--topic", help=TOPIC_HELP)
API_KEY = typer.Option(
    "", "--api-key", envvar="TURNSTREAM_PROXY_API_KEY", help="the proxy's API key, if any"
)
EVERY = typer.Option(5.0, "--progress-every", min=0.1, help="seconds between progress lines")
MODEL_NAME = typer.Option(
    None, "--model-name", help="the model to ask instead of each task's model_name"
)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _processor(classpath: str) -> Any:
    """The processor at ``classpath``, checked and set up; one that cannot be used exits 2."""
    from pipeline.rollouts.components import prepare

    try:
        return prepare(classpath, "rollout", "--processor: ")
    except RolloutError as exc:
        fail(2, str(exc))


async def _run(processor: Any, tasks: list[Any], plan: Any, every_s: float) -> Any:
    from pipeline.produce import TurnProducer
    from pipeline.rewards.protocols import close_processor
    from pipeline.rollouts.stage import Progress, ProxySessionEnds, RolloutStage
    from pipeline.settings import load_settings

    ends = ProxySessionEnds(plan.model_url, plan.api_key)
    dead = TurnProducer(load_settings())
    progress = Progress(len(tasks), plan.n)
    try:
        stage = RolloutStage(processor, plan, ends, dead, progress)
        await stage.run(tasks, _say, every_s)
    finally:
        await ends.close()
        await close_processor(processor)
        try:
            dead.flush()  # the dead letters are on the topic before the command says so
        finally:
            dead.close()
    return progress


async def _feed(processor: Any, plan: Any, feed_plan: Any, settings: Any) -> Any:
    """The topic's tasks through the stage until stopped; SIGTERM or Ctrl-C stops it."""
    from pipeline.produce import TurnProducer
    from pipeline.rewards.protocols import close_processor
    from pipeline.rollouts.feed import TaskFeed
    from pipeline.rollouts.stage import Progress, ProxySessionEnds, RolloutStage

    ends = ProxySessionEnds(plan.model_url, plan.api_key)
    dead = TurnProducer(settings)
    feed = TaskFeed(RolloutStage(processor, plan, ends, dead, Progress(0, plan.n)), dead,
                    feed_plan, _say)  # fmt: skip
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, feed.stop)
    try:
        await feed.run(settings)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await ends.close()
        await close_processor(processor)
        try:
            dead.flush()
        finally:
            dead.close()
    return feed


def _from_file(processor: str, tasks: Path, plan: Any, every_s: float) -> None:
    from pipeline.rollouts.tasks import read_tasks

    try:
        read = read_tasks(tasks)
    except RolloutError as exc:
        fail(2, str(exc))
    built = _processor(processor)
    _say(
        f"run {plan.run_id}: {len(read)} task(s) x {plan.n} through {plan.model_url}, "
        f"{plan.concurrency} at once, up to {plan.max_attempts} attempt(s) each"
    )
    progress = asyncio.run(_run(built, read, plan, every_s))
    _say(progress.line())
    typer.echo(orjson.dumps({"run_id": plan.run_id, **progress.summary()}).decode())
    if progress.dead_lettered:
        fail(1, f"{progress.dead_lettered} of {len(read)} task(s) dead-lettered")


def _from_topic(
    processor: str,
    plan: Any,
    topic: str,
    group: str | None,
    until_end: bool,
    max_in_flight: int | None,
    every_s: float,
) -> None:
    from pipeline.rollouts.feed import FeedPlan
    from pipeline.settings import load_settings

    settings = load_settings()
    try:
        name = settings.topics[topic].name
    except ConfigError as exc:
        fail(2, f"--topic: {exc}")
    feed_plan = FeedPlan(name, group or settings.topic_prefix + DEFAULT_GROUP,
                         max_in_flight or plan.concurrency, until_end, every_s)  # fmt: skip
    built = _processor(processor)
    _say(
        f"run {plan.run_id}: tasks from {name} (group {feed_plan.group}), up to "
        f"{feed_plan.max_in_flight} taken at once, each x {plan.n} through {plan.model_url}, "
        f"{plan.concurrency} attempt(s) at once, up to {plan.max_attempts} each"
        + ("; until the topic's end" if until_end else "; until stopped")
    )
    feed = asyncio.run(_feed(built, plan, feed_plan, settings))
    _say(feed.line())
    summary = {"run_id": plan.run_id, "topic": name, "group": feed_plan.group, **feed.summary()}
    typer.echo(orjson.dumps(summary).decode())
    bad = summary["dead_lettered"] + summary["bad_records"]
    if bad:
        fail(1, f"{summary['dead_lettered']} task(s) and {summary['bad_records']} bad "
                f"record(s) dead-lettered")  # fmt: skip


def _checked(tasks: bool, topic: bool, topic_only: bool, run_id: str | None) -> str:
    """The run id, once the options make sense together (else exit 2)."""
    from pipeline.rollouts.tasks import check_run_id, new_run_id

    if tasks == topic:
        fail(2, "give --tasks FILE or --topic TOPIC (one of them)")
    if tasks and topic_only:
        fail(2, "--group, --until-end and --max-in-flight go with --topic, not --tasks")
    try:
        return check_run_id(run_id) if run_id is not None else new_run_id()
    except RolloutError as exc:
        fail(2, f"--run-id: {exc}")


def run(
    processor: str = typer.Option(..., "--processor", help=PROCESSOR_HELP),
    tasks: Path = TASKS,
    topic: str = TOPIC,
    group: str = typer.Option(None, "--group", help=GROUP_HELP),
    until_end: bool = typer.Option(False, "--until-end", help=UNTIL_END_HELP),
    max_in_flight: int = typer.Option(None, "--max-in-flight", min=1, help=IN_FLIGHT_HELP),
    n: int = typer.Option(1, "--n", min=1, max=1024, help="rollouts of each task (one group)"),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="attempts run at once"),
    model_url: str = typer.Option(..., "--model-url", help=MODEL_URL_HELP),
    model_name: str = MODEL_NAME,
    api_key: str = API_KEY,
    max_attempts: int = typer.Option(3, "--max-attempts", min=1, help=ATTEMPTS_HELP),
    progress_every_s: float = EVERY,
    run_id: str = typer.Option(None, "--run-id", help=RUN_ID_HELP),
) -> None:
    """Run each task N times (one group) through a rollout processor: the tasks of a file
    (--tasks), or those a topic holds and is sent (--topic rollout.tasks).

    Every model call of an attempt goes through the capture proxy's rollout
    route, so it is captured as the attempt's session
    (rollout:RUN:TASK:INDEX:ATTEMPT) with the task's group id (rollout:RUN:TASK)
    and size N; RUN, the run id, is new each time the command starts (--run-id).
    When process() returns the session is ended: a SUCCESS trains, with its
    rollout_metrics on the samples; FAILED, an exception or a timeout
    (sampling_params.timeout) ends it as failed (its turns never train) and the
    rollout is tried again as a fresh session, up to --max-attempts; then the
    task goes to the dead-letter topic with the error.

    With --topic the command is a member of --group: the members share the
    topic's partitions, and a task's offset is committed once every rollout of
    it has finished (and those before it on its partition): a member killed
    mid-task loses nothing, the next one to hold the partition runs the task
    again as new sessions (the half-done one never trains: the scoring worker's
    idle timeout, TURNSTREAM_SCORING_IDLE_TIMEOUT_S, ends it as failed). Up to
    --max-in-flight tasks are taken at once. A record that is no task is dead-lettered with the
    reason and its topic:partition@offset. SIGTERM or Ctrl-C takes no more
    tasks and lets the running ones finish (a second one abandons them: they
    are run again); only finished tasks are committed. `rollout submit` puts a
    task file on rollout.tasks.

    Prints progress lines and a JSON summary; exits 0 when every task succeeded,
    1 when some were dead-lettered, 2 for options, a processor or a task file
    that cannot be used.
    """
    from pipeline.rollouts.stage import RolloutPlan

    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    topic_only = group is not None or until_end or max_in_flight is not None
    run = _checked(tasks is not None, topic is not None, topic_only, run_id)
    plan = RolloutPlan(model_url, model_name, api_key, n, concurrency, max_attempts, run)
    if tasks is not None:
        _from_file(processor, tasks, plan, progress_every_s)
    else:
        _from_topic(processor, plan, topic, group, until_end, max_in_flight, progress_every_s)


def submit(
    tasks: Path = typer.Option(..., "--tasks", help="a JSONL file, one RolloutInput a line"),
) -> None:
    """Put the tasks of a file on rollout.tasks, one record each keyed by its task id,
    for `rollout run --topic rollout.tasks`.

    The file is read as `rollout run --tasks` reads it: every bad line is named
    and nothing is sent (exit 2). A line goes as it is; a task without a task_id
    of its own ({file stem}-{line}) takes it from its record's key.
    """
    from pipeline.rollouts.feed import submit as submit_tasks
    from pipeline.rollouts.tasks import read_tasks
    from pipeline.settings import load_settings

    try:
        read = read_tasks(tasks)
    except RolloutError as exc:
        fail(2, str(exc))
    topic = asyncio.run(submit_tasks(load_settings(), read))
    _say(f"sent {len(read)} task(s) to {topic}")
