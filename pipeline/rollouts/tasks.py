"""The pure part of the rollout stage: tasks from a file, attempt names, retry decisions.

A task file holds one ``RolloutInput`` a line (unknown fields kept in
``rollout_extra``). Each task runs ``n`` times as one group; each of those
rollouts is tried up to ``max_attempts`` times, every attempt a fresh session
on the capture proxy's rollout route:

- run id: one per ``rollout run`` process (``--run-id``, else :func:`new_run_id`), so
  a task file run again, or a task taken again from ``rollout.tasks``, is new sessions;
- task id: ``rollout_extra.task_id`` if the task has one, else ``{file stem}-{line}``;
- group id: ``rollout:{run_id}:{task_id}``, group size ``n``;
- session id: ``rollout:{run_id}:{task_id}:{index}:{attempt}`` (index from 0, attempt
  from 1).

The task a processor sees has ``model_resource`` pointed at the rollout route
(see :mod:`pipeline.proxy.rollout_route`), and ``request_metadata`` with
``run_id``, ``rollout_id`` (``{task_id}:{index}``) and ``attempt_id`` (the attempt).
"""

from __future__ import annotations

import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import RolloutError
from pipeline.events import MAX_SESSION_ID_CHARS
from pipeline.rollouts.run import rollout_input
from pipeline.rollouts.types import ModelResource, RolloutInput

# a run id as given: letters, digits, ".", "_", "-" (":" separates a session id's parts)
RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,24}")
# room in a session id for a run id as used: one given, or one with ".{k}" after it (a task
# taken again by one process: pipeline.rollouts.feed)
MAX_RUN_ID_CHARS = 32
# room in a session id for "rollout:", "{run_id}:", ":{index}:{attempt}"
MAX_TASK_ID_CHARS = MAX_SESSION_ID_CHARS - 32 - (MAX_RUN_ID_CHARS + 1)

Decision = Literal["done", "retry", "dead_letter"]


def new_run_id() -> str:
    """A fresh run id: 8 random hex digits."""
    return secrets.token_hex(4)


def check_run_id(run_id: str) -> str:
    """``run_id`` if it can name a run; RolloutError says what one may hold."""
    if not RUN_ID.fullmatch(run_id):
        raise RolloutError(
            f"run id {run_id!r}: 1 to 24 letters, digits, '.', '_' or '-' (it is part of "
            "every session id)"
        )
    return run_id


@dataclass(frozen=True)
class Task:
    """One task: its id, the task, where it came from (file:line, topic:partition@offset)
    and its bytes; ``run_id`` names its sessions instead of the stage's run when given."""

    task_id: str
    input: RolloutInput
    source: str
    raw: bytes
    run_id: str | None = None


@dataclass(frozen=True)
class Attempt:
    """One try at one rollout of a task in one run."""

    run_id: str
    task_id: str
    index: int  # which of the task's n rollouts, from 0
    attempt: int  # from 1

    @property
    def session_id(self) -> str:
        return f"{self.group_id}:{self.index}:{self.attempt}"

    @property
    def group_id(self) -> str:
        return group_id(self.run_id, self.task_id)

    @property
    def rollout_id(self) -> str:
        return f"{self.task_id}:{self.index}"

    def again(self) -> Attempt:
        """The next try at the same rollout: a fresh session."""
        return Attempt(self.run_id, self.task_id, self.index, self.attempt + 1)


def group_id(run_id: str, task_id: str) -> str:
    return f"rollout:{run_id}:{task_id}"


def decide(succeeded: bool, attempt: int, max_attempts: int) -> Decision:
    """After attempt ``attempt``: done, tried again, or (its tries spent) dead-lettered."""
    if succeeded:
        return "done"
    return "retry" if attempt < max_attempts else "dead_letter"


def task_id_of(task: RolloutInput, default: str) -> str:
    """``rollout_extra.task_id`` (a string or an integer), else ``default``."""
    given = task.rollout_extra.get("task_id")
    if isinstance(given, str) and given.strip():
        return given
    if isinstance(given, int) and not isinstance(given, bool):
        return str(given)
    return default


def parse_task(line: bytes, source: str, default_id: str) -> Task:
    """One task line; RolloutError says where and what is wrong."""
    task = rollout_input(line, source)
    task_id = task_id_of(task, default_id)
    if len(task_id) > MAX_TASK_ID_CHARS:
        raise RolloutError(
            f"{source}: task_id is {len(task_id)} characters; at most {MAX_TASK_ID_CHARS}"
        )
    return Task(task_id, task, source, line)


def parse_tasks(lines: list[bytes], name: str, stem: str) -> list[Task]:
    """Every task of a file's lines (blank lines skipped); every bad line is named at once."""
    tasks: list[Task] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        source = f"{name}:{number}"
        try:
            task = parse_task(line, source, f"{stem}-{number}")
        except RolloutError as exc:
            problems.append(str(exc))
            continue
        if task.task_id in seen:
            problems.append(f"{source}: task_id {task.task_id!r} is also {seen[task.task_id]}'s")
            continue
        seen[task.task_id] = source
        tasks.append(task)
    if problems:
        raise RolloutError("the task file cannot be used:\n  " + "\n  ".join(problems))
    if not tasks:
        raise RolloutError(f"{name}: no tasks (one RolloutInput JSON a line)")
    return tasks


def read_tasks(path: Path) -> list[Task]:
    """The tasks of a JSONL file."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise RolloutError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_tasks(lines, str(path), path.stem)


def attempt_input(
    task: Task, attempt: Attempt, base_url: str, model_name: str | None, api_key: str
) -> RolloutInput:
    """The task as one attempt sees it: its model on the rollout route, its ids named.

    A copy, so its trace starts empty (a fresh attempt records only its own calls).
    """
    resource = task.input.model_resource
    model = ModelResource(
        model_name=model_name if model_name is not None else resource.model_name,
        base_url=base_url,
        api_key=api_key,
    )
    metadata: dict[str, Any] = {
        **(task.input.request_metadata or {}),
        "run_id": attempt.run_id,
        "rollout_id": attempt.rollout_id,
        "attempt_id": str(attempt.attempt),
    }
    return task.input.model_copy(update={"model_resource": model, "request_metadata": metadata})


def rollout_metrics_of(
    out_metrics: dict[str, float] | None, agent_metrics: dict[str, float] | None
) -> dict[str, float]:
    """A SUCCESS's metrics: the agent output's, with the RolloutOutput's own over them;
    values that are no finite number (JSON cannot carry them) are left out."""
    merged = {**(agent_metrics or {}), **(out_metrics or {})}
    return {k: float(v) for k, v in merged.items() if math.isfinite(v)}
