"""The rollout stage: tasks run by a rollout processor through the capture proxy.

Each task runs ``n`` times as one group; up to ``concurrency`` attempts run at
once on one event loop. An attempt gets the task with its ``model_resource`` on
the proxy's rollout route (:mod:`pipeline.proxy.rollout_route`), so every
model call any client of the processor makes is captured as that attempt's
session. When ``process()`` returns (or raises, or overruns
``sampling_params.timeout``, which bounds the whole call:
:func:`pipeline.rollouts.run.run_rollout`) the stage ends the
session on the proxy: ``success`` with the rollout's metrics, else ``failed``,
whose turns never train. A failed attempt is tried again as a fresh session,
up to ``max_attempts``; then the task goes to the dead-letter topic with the
error. What is pure (names, decisions, task parsing) is in
:mod:`pipeline.rollouts.tasks`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from pipeline.backoff import RetryPolicy, retry_async
from pipeline.errors import RolloutError
from pipeline.proxy.rollout_route import RolloutRoute, base_url, end_url
from pipeline.rollouts.protocols import RolloutProcessor
from pipeline.rollouts.run import failed, run_rollout
from pipeline.rollouts.tasks import (
    Attempt,
    Task,
    attempt_input,
    decide,
    new_run_id,
    rollout_metrics_of,
)
from pipeline.rollouts.types import RolloutOutput

log = logging.getLogger(__name__)

END_TIMEOUT_S = 30.0
END_RETRY = RetryPolicy(max_attempts=4, initial_delay_s=0.5, max_delay_s=5.0, jitter=True)


@dataclass(frozen=True)
class RolloutPlan:
    """How the stage runs its tasks (``turnstream rollout run``'s options)."""

    model_url: str  # the capture proxy's OpenAI base URL
    model_name: str | None = None  # instead of each task's model_resource.model_name
    api_key: str = ""  # sent to the proxy by the processor's clients and the stage
    n: int = 1
    concurrency: int = 4
    max_attempts: int = 3
    run_id: str = field(default_factory=new_run_id)  # names every attempt's session


@dataclass
class Progress:
    """What the stage has done so far; written and read on the event loop only."""

    tasks: int
    rollouts_per_task: int
    done: int = 0  # tasks whose every rollout succeeded
    dead_lettered: int = 0  # tasks with a rollout whose tries were all spent
    rollouts: int = 0  # rollouts that succeeded
    attempts: int = 0  # attempts finished
    retried: int = 0  # failed attempts tried again
    started: float = field(default_factory=time.monotonic)

    def line(self, now: float | None = None) -> str:
        elapsed = max((now or time.monotonic()) - self.started, 1e-9)
        return (
            f"tasks {self.done + self.dead_lettered}/{self.tasks} ({self.done} done, "
            f"{self.dead_lettered} dead-lettered); rollouts {self.rollouts}/"
            f"{self.tasks * self.rollouts_per_task}, {self.attempts} attempt(s), "
            f"{self.retried} retried; {self.rollouts / elapsed:.2f} rollouts/s"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "done": self.done,
            "dead_lettered": self.dead_lettered,
            "rollouts": self.rollouts,
            "attempts": self.attempts,
            "retried": self.retried,
            "seconds": round(time.monotonic() - self.started, 3),
        }


@dataclass(frozen=True)
class Ending:
    """How an attempt ended, as its session's end tells the pairing stage."""

    succeeded: bool
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    ground_truth: Any = None  # the task's: on every turn, for the reward processors
    messages: list[dict[str, Any]] | None = None  # the AgentOutput's: the whole rollout

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": "success" if self.succeeded else "failed",
            "rollout_metrics": self.metrics,
            "error": self.error,
        }
        if self.succeeded:
            out.update(ground_truth=self.ground_truth, messages=self.messages)
        return out


def ending_of(task: Task, out: RolloutOutput) -> Ending:
    """The end of an attempt whose processor gave ``out``."""
    if not out.ok:
        return Ending(False, error=out.error)
    metrics = rollout_metrics_of(out.rollout_metrics, out.agent_output.rollout_metrics)
    messages = list(out.agent_output.messages) or None
    return Ending(True, metrics, None, task.input.ground_truth, messages)


class SessionEnds(Protocol):
    """Ends an attempt's session on the proxy (:class:`ProxySessionEnds`)."""

    async def end(self, session_id: str, ending: Ending) -> None: ...


class DeadLetterSink(Protocol):
    """Where a task whose tries are spent goes (a ``TurnProducer``)."""

    def dead_letter_raw(self, stage: str, error: str, source: str, raw: bytes) -> None: ...


class ProxySessionEnds:
    """``POST {proxy}/rollouts/{session_id}/end``: one HTTP session, bounded retries."""

    def __init__(self, model_url: str, api_key: str = "") -> None:
        self.model_url = model_url
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http: aiohttp.ClientSession | None = None

    async def end(self, session_id: str, ending: Ending) -> None:
        body = ending.body()
        url = end_url(self.model_url, session_id)

        async def post(_attempt: int) -> None:
            async with self._session().post(url, json=body, headers=self.headers) as resp:
                if resp.status >= 500:
                    resp.raise_for_status()  # the proxy in trouble: tried again
                if resp.status != 202:
                    text = (await resp.text())[:300]
                    raise RolloutError(f"the proxy refused to end {session_id}: {text}")

        try:
            await retry_async(post, END_RETRY, (aiohttp.ClientError, TimeoutError))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise RolloutError(f"cannot end session {session_id} at {url}: {exc}") from exc

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=END_TIMEOUT_S))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


class RolloutStage:
    """Runs tasks, retries failed attempts, ends sessions and dead-letters what never succeeds."""

    def __init__(
        self,
        processor: RolloutProcessor,
        plan: RolloutPlan,
        ends: SessionEnds,
        dead: DeadLetterSink,
        progress: Progress,
    ) -> None:
        self.processor = processor
        self.plan = plan
        self.ends = ends
        self.dead = dead
        self.progress = progress
        self._slots = asyncio.Semaphore(plan.concurrency)

    async def run(
        self, tasks: list[Task], report: Callable[[str], None], every_s: float = 5.0
    ) -> Progress:
        """Every task to the end, ``report`` given a progress line every ``every_s``."""

        async def tick() -> None:
            while True:
                await asyncio.sleep(every_s)
                report(self.progress.line())

        ticker = asyncio.ensure_future(tick())
        try:
            await asyncio.gather(*(self.run_task(task) for task in tasks))
        finally:
            ticker.cancel()
        return self.progress

    async def run_task(self, task: Task) -> None:
        """Every rollout of ``task`` to its end: succeeded, or its task dead-lettered."""
        results = await asyncio.gather(
            *(self._rollout(task, index) for index in range(self.plan.n))
        )
        if all(results):
            self.progress.done += 1
        else:
            self.progress.dead_lettered += 1

    async def _rollout(self, task: Task, index: int) -> bool:
        """One rollout of ``task``, tried until it succeeds or its tries are spent."""
        attempt = Attempt(task.run_id or self.plan.run_id, task.task_id, index, 1)
        while True:
            async with self._slots:
                out = await self._attempt(task, attempt)
            self.progress.attempts += 1
            decision = decide(out.ok, attempt.attempt, self.plan.max_attempts)
            if decision == "done":
                self.progress.rollouts += 1
                return True
            log.info("%s failed (attempt %d): %s", attempt.session_id, attempt.attempt, out.error)
            if decision == "retry":
                self.progress.retried += 1
                attempt = attempt.again()
                continue
            error = (
                f"task {task.task_id} rollout {index}: {attempt.attempt} attempt(s) failed, "
                f"the last ({attempt.session_id}): {out.error}"
            )
            self.dead.dead_letter_raw("rollout", error, task.source, task.raw)
            return False

    async def _attempt(self, task: Task, attempt: Attempt) -> RolloutOutput:
        """Run one attempt and end its session; an end the proxy never took fails it."""
        route = RolloutRoute(
            attempt.session_id,
            attempt.group_id,
            self.plan.n,
            task.input.sampling_params.max_turns,
        )
        url = base_url(self.plan.model_url, route)
        given = attempt_input(task, attempt, url, self.plan.model_name, self.plan.api_key)
        out = await run_rollout(self.processor, given)
        try:
            await self.ends.end(attempt.session_id, ending_of(task, out))
        except RolloutError as exc:
            log.error("%s", exc)
            return failed(f"its session could not be ended: {exc}") if out.ok else out
        return out
