"""One rollout as the rollout stage and the local commands run it: bounded, and always an output.

``run_rollout`` calls ``process()`` once under the task's
``sampling_params.timeout``; a timeout is a FAILED output ("timed out after
N s"), and so is an exception (its text as the error, its traceback in the
log), so a caller always gets a ``RolloutOutput`` to send on. ``rollout_input``
parses a task, its problems named by the field.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.errors import RolloutError
from pipeline.rewards.protocols import processor_name
from pipeline.rewards.types import TaskStatus
from pipeline.rollouts.protocols import RolloutProcessor, run_rollout_processor
from pipeline.rollouts.trace import error_text
from pipeline.rollouts.types import ModelResource, RolloutInput, RolloutOutput

log = logging.getLogger(__name__)


def input_problems(exc: ValidationError) -> list[str]:
    """Each error of a RolloutInput's validation as ``field.path: problem``."""
    return [
        f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: "
        + ("unknown field" if err["type"] == "extra_forbidden" else err["msg"])
        for err in exc.errors(include_url=False)
    ]


def rollout_input(data: Any, source: str) -> RolloutInput:
    """``data`` (JSON bytes, or the object they decode to) as a task; ``source`` names it."""
    if isinstance(data, bytes | str):
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise RolloutError(f"{source}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RolloutError(f"{source}: expected a JSON object, got {type(data).__name__}")
    try:
        return RolloutInput.model_validate(data)
    except ValidationError as exc:
        problems = "\n  ".join(input_problems(exc))
        raise RolloutError(f"{source}: not a RolloutInput:\n  {problems}") from exc


def on_model(
    task: RolloutInput,
    base_url: str | None = None,
    model_name: str | None = None,
    api_key: str | None = None,
) -> RolloutInput:
    """``task`` with the policy's URL, model name or key replaced where given.

    A new URL drops the task's key unless ``api_key`` is given: the key belongs
    to the server the task named, and is not sent to another one.
    """
    changes: dict[str, str] = {}
    if base_url is not None:
        changes.update(base_url=base_url, api_key="")
    if model_name is not None:
        changes["model_name"] = model_name
    if api_key is not None:
        changes["api_key"] = api_key
    if not changes:
        return task
    resource = ModelResource.model_validate({**task.model_resource.model_dump(), **changes})
    return task.model_copy(update={"model_resource": resource})


def failed(error: str) -> RolloutOutput:
    return RolloutOutput(status=TaskStatus.FAILED, error=error)


async def run_rollout(processor: RolloutProcessor, input: RolloutInput) -> RolloutOutput:
    """``process(input)`` once, within ``input.sampling_params.timeout``; raises no Exception.

    A timeout cancels an ``async def`` process; a plain ``def`` one cannot be
    stopped, and its thread runs on until it returns (its output is dropped).
    """
    name = processor_name(processor)
    timeout = input.sampling_params.timeout
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await run_rollout_processor(processor, input)
    except TimeoutError as exc:
        if not deadline.expired():  # a TimeoutError of process's own
            log.exception("%s.process raised", name)
            return failed(f"{name}.process raised {error_text(exc)}")
        still = "" if inspect.iscoroutinefunction(processor.process) else " (its thread runs on)"
        log.warning("%s.process timed out after %g s%s", name, timeout, still)
        return failed(f"timed out after {timeout:g} s (sampling_params.timeout)")
    except RolloutError as exc:  # the contract broken (a wrong output): the error says how
        log.exception("%s.process failed", name)
        return failed(str(exc))
    except Exception as exc:
        log.exception("%s.process raised", name)
        return failed(f"{name}.process raised {error_text(exc)}")
