"""`turnstream rollout test` and `turnstream rollout serve`: a rollout processor, run locally.

Exit status of `rollout test`: 0 a SUCCESS output; 1 a FAILED one (a timeout
or an exception in process() among them); 2 a class path or an input file
that cannot be used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import typer

from pipeline.cli.output import echo_json, fail, stderr
from pipeline.errors import RolloutError
from pipeline.rewards.loading import CLASSPATH_FORMS
from pipeline.rewards.protocols import close_processor, processor_name
from pipeline.rollouts.components import prepare
from pipeline.rollouts.run import on_model, rollout_input, run_rollout
from pipeline.rollouts.types import RolloutInput, RolloutOutput

app = typer.Typer(
    help="Rollout processors: run one locally, once or as a server.", no_args_is_help=True
)

PROCESSOR_HELP = f"the rollout processor class: {CLASSPATH_FORMS}"
MODEL_URL_HELP = (
    "the policy's OpenAI-compatible root, e.g. http://127.0.0.1:30001/v1, instead of the "
    "task's model_resource.base_url (the task's api_key is then not sent)"
)
MODEL_NAME_HELP = "the model to ask instead of the task's model_resource.model_name"
API_KEY_HELP = "the key to send to the policy instead of the task's model_resource.api_key"


def _prepared(classpath: str) -> Any:
    """The processor at ``classpath``, checked and set up; one that cannot be used exits 2."""
    try:
        return prepare(classpath, "rollout")
    except RolloutError as exc:
        fail(2, str(exc))


def _read_task(path: Path) -> RolloutInput:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        fail(2, f"{path}: cannot read: {exc.strerror or exc}")
    try:
        return rollout_input(raw, str(path))
    except RolloutError as exc:
        fail(2, str(exc))


async def _run_once(processor: Any, task: RolloutInput) -> RolloutOutput:
    try:
        return await run_rollout(processor, task)
    finally:
        await close_processor(processor)


def _summary(name: str, task: RolloutInput, out: RolloutOutput, seconds: float) -> str:
    trace = task.trace
    return (
        f"{name}: {out.status.value} in {seconds:.2f} s; {len(trace.model_calls)} model "
        f"call(s), {len(trace.tool_calls)} tool call(s) traced"
    )


@app.command("test")
def rollout_test(
    processor: str = typer.Option(..., "--processor", help=PROCESSOR_HELP),
    input: Path = typer.Option(
        ..., "--input", help="a RolloutInput JSON, such as the SDK guide's rollout_input.json"
    ),
    model_url: str = typer.Option(None, "--model-url", help=MODEL_URL_HELP),
    model_name: str = typer.Option(None, "--model-name", help=MODEL_NAME_HELP),
    api_key: str = typer.Option(None, "--api-key", help=API_KEY_HELP),
) -> None:
    """Run a rollout processor once on one task and print its RolloutOutput as JSON.

    setup() runs first, then process() once, within the task's
    sampling_params.timeout: a timeout, or an exception in process(), is a
    FAILED output. --model-url and --model-name point the task at a policy
    server of your own (`turnstream serve`, the capture proxy) instead of the
    one its model_resource names. Exits 1 when the output is FAILED, 2 when
    the class path or the input file cannot be used.
    """
    task = on_model(_read_task(input), model_url, model_name, api_key)
    built = _prepared(processor)
    name = processor_name(built)
    resource = task.model_resource
    stderr.print(
        f"{name}: model {resource.model_name or '(none)'} at {resource.base_url or '(none)'}, "
        f"timeout {task.sampling_params.timeout:g} s",
        highlight=False,
    )
    started = time.perf_counter()
    out = asyncio.run(_run_once(built, task))
    echo_json(out.model_dump(mode="json"))
    stderr.print(_summary(name, task, out, time.perf_counter() - started), highlight=False)
    if not out.ok:
        fail(1, f"{name} FAILED: {out.error}")


@app.command("serve")
def rollout_serve(
    processor: str = typer.Option(..., "--processor", help=PROCESSOR_HELP),
    host: str = typer.Option("127.0.0.1", help="listen address"),
    port: int = typer.Option(30030, min=0, max=65535, help="listen port"),
    concurrency: int = typer.Option(16, min=1, help="rollouts run at once; more requests wait"),
    model_url: str = typer.Option(None, "--model-url", help=MODEL_URL_HELP),
    model_name: str = typer.Option(None, "--model-name", help=MODEL_NAME_HELP),
    api_key: str = typer.Option(None, "--api-key", help=API_KEY_HELP),
    loglevel: str = typer.Option("info", help="error | warning | info | debug"),
) -> None:
    """Serve a rollout processor over HTTP: POST /rollout, GET /health.

    POST a RolloutInput as JSON (examples/rollouts/query.sh does) and get its
    RolloutOutput back: HTTP 200 for SUCCESS and FAILED alike (the status is
    in the body; a timeout or an exception in process() is FAILED), 400 with
    the problems for a body that is no RolloutInput. setup() runs once before
    the server listens; a class path that cannot be used exits 2. A plain def
    process() runs in a thread of its own, up to --concurrency at once.
    """
    from pipeline.rollouts.serve import build_rollout_app, run_rollout_server

    logging.basicConfig(
        level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    built = _prepared(processor)
    model: dict[str, str | None] = {
        "base_url": model_url,
        "model_name": model_name,
        "api_key": api_key,
    }
    run_rollout_server(build_rollout_app(built, concurrency, model), host, port)
