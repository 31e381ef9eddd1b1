"""`turnstream rollout run`: tasks from a file through a rollout processor and the capture proxy.

Exit status: 0 when every task succeeded, 1 when some were dead-lettered (or
Kafka or the proxy could not be used), 2 when the processor or the task file
cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import orjson
import typer

from pipeline.cli.output import fail
from pipeline.errors import RolloutError

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


def run(
    processor: str = typer.Option(..., "--processor", help=PROCESSOR_HELP),
    tasks: Path = typer.Option(..., "--tasks", help="a JSONL file, one RolloutInput a line"),
    n: int = typer.Option(1, "--n", min=1, max=1024, help="rollouts of each task (one group)"),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="attempts run at once"),
    model_url: str = typer.Option(..., "--model-url", help=MODEL_URL_HELP),
    model_name: str = typer.Option(
        None, "--model-name", help="the model to ask instead of each task's model_name"
    ),
    api_key: str = typer.Option(
        "", "--api-key", envvar="TURNSTREAM_PROXY_API_KEY", help="the proxy's API key, if any"
    ),
    max_attempts: int = typer.Option(
        3, "--max-attempts", min=1, help="tries of each rollout before its task is dead-lettered"
    ),
    progress_every_s: float = typer.Option(
        5.0, "--progress-every", min=0.1, help="seconds between progress lines"
    ),
    run_id: str = typer.Option(None, "--run-id", help=RUN_ID_HELP),
) -> None:
    """Run each task of a file N times (one group) through a rollout processor.

    Every model call of an attempt goes through the capture proxy's rollout
    route, so it is captured as the attempt's session
    (rollout:RUN:TASK:INDEX:ATTEMPT) with the task's group id (rollout:RUN:TASK)
    and size N; RUN, the run id, is new each time the command starts (--run-id),
    so running a file again is new sessions. When process() returns the session is
    ended: a SUCCESS trains, with its rollout_metrics on the samples; FAILED, an
    exception or a timeout (sampling_params.timeout) ends it as failed (its turns
    never train) and the rollout is tried again as a fresh session, up to
    --max-attempts; then the task goes to the dead-letter topic with the error.
    Prints progress lines and a JSON summary; exits 0 when every task succeeded,
    1 when some were dead-lettered.
    """
    from pipeline.rollouts.stage import RolloutPlan
    from pipeline.rollouts.tasks import check_run_id, new_run_id, read_tasks

    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run = check_run_id(run_id) if run_id is not None else new_run_id()
        read = read_tasks(tasks)
    except RolloutError as exc:
        fail(2, str(exc))
    built = _processor(processor)
    plan = RolloutPlan(model_url, model_name, api_key, n, concurrency, max_attempts, run)
    _say(
        f"run {run}: {len(read)} task(s) x {n} through {model_url}, {concurrency} at once, "
        f"up to {max_attempts} attempt(s) each"
    )
    progress = asyncio.run(_run(built, read, plan, progress_every_s))
    _say(progress.line())
    typer.echo(orjson.dumps({"run_id": run, **progress.summary()}).decode())
    if progress.dead_lettered:
        fail(1, f"{progress.dead_lettered} of {len(read)} task(s) dead-lettered")
