"""The user population in a background thread, and the live loop that follows a run."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeline.errors import TurnstreamError
from pipeline.learn import sentinels
from pipeline.learn.freshness import sample_id
from pipeline.learn.monitor import Monitor
from pipeline.learn.report import per_version
from pipeline.learn.stack import Proc
from pipeline.learn.users import Population, ServedTurn
from pipeline.learn.view import LiveView, Snapshot
from pipeline.processes import tail


class Users:
    """A population talking from its own thread (its own event loop) until ``stop``."""

    def __init__(self, population: Population) -> None:
        self.population = population
        self.started = time.monotonic()
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._main, name="users", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)

    def _main(self) -> None:
        try:
            asyncio.run(self._talk())
        except asyncio.CancelledError:
            pass  # stopped
        except BaseException as exc:  # shown by the live loop, which stops the run
            self.error = exc

    async def _talk(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.ensure_future(self.population.run())
        self._ready.set()
        await self._task

    @property
    def turns(self) -> list[ServedTurn]:
        return list(self.population.turns)

    def rate(self) -> float:
        return len(self.population.turns) / max(time.monotonic() - self.started, 1e-9)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Users leave now: sessions in flight are abandoned (their turns are not recorded)."""
        self.population.stopping = True
        if self._loop is not None and self._task is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=timeout_s)


# between two looks at the run (the monitor's poll waits up to 0.2 s more): held users start
# this soon after the trainer's ledger settles their batch
FOLLOW_PAUSE_S = 0.1
STALL_S = 600.0  # users held back this long while nothing moves: the run cannot go on


class Stall:
    """Raises when the users are held back (``max_ahead``) and nothing has moved for
    ``limit_s``: no turn served, no sample scored, trained or excluded, no step."""

    def __init__(self, limit_s: float = STALL_S, clock: Callable[[], float] = time.monotonic):
        self.limit_s, self.clock = limit_s, clock
        self.mark: tuple[int, ...] | None = None
        self.since = clock()

    def check(self, paused: bool, progress: tuple[int, ...], waiting: int) -> None:
        now = self.clock()
        if not paused or progress != self.mark:
            self.mark, self.since = progress, now
            return
        if now - self.since > self.limit_s:
            raise TurnstreamError(
                f"the users have waited {now - self.since:.0f}s for the trainer and nothing "
                f"moved: {waiting} served turn(s) have no trained or excluded sample yet. A turn "
                "the capture proxy did not record never gets one (its /healthz counts them under "
                "not_recorded); the worker's and trainer's logs say where the others are"
            )


@dataclass
class Watched:
    """Child processes that must stay up while the loop runs: name -> (process, log)."""

    children: dict[str, tuple[Proc, Path]] = field(default_factory=dict)

    def check(self) -> None:
        for name, (proc, log) in self.children.items():
            if proc.poll() is not None:
                raise TurnstreamError(f"the {name} exited with {proc.returncode}:\n{tail(log)}")


def settled(turns: list[ServedTurn], monitor: Monitor, batch_size: int | None = None) -> int:
    """Served turns whose sample the trainer trained (its weights pushed first) or excluded.

    With ``batch_size`` (every sample of ``turns`` is this trainer's, each step takes that
    many): a push counts its step's samples as trained before the ledger lists them. The
    ledger is written after the checkpoint that follows the push, so the users start the
    next batch, on the pushed weights, while the trainer checkpoints."""
    trained = excluded = 0
    for t in turns:
        scored = monitor.scored.get(sample_id(t))
        if sample_id(t) in monitor.trained:
            trained += 1
        elif scored is not None and not scored.included:
            excluded += 1
    if batch_size is not None:
        pushed = monitor.pushed_step * batch_size
        trained = max(trained, min(pushed, len(turns) - excluded))
    return trained + excluded


def waiting_samples(turns: list[ServedTurn], monitor: Monitor) -> int:
    """Served turns whose sample is neither trained nor excluded yet."""
    return len(turns) - settled(turns, monitor)


def snapshot(
    phase: str,
    users: Users,
    monitor: Monitor,
    started: float,
    max_steps: int,
    sentinel: sentinels.Sentinels | None = None,
) -> Snapshot:
    turns = users.turns
    ids = {sample_id(t) for t in turns}
    scored = [s for s in monitor.scored.values() if s.sample_id in ids]
    return Snapshot(
        phase=phase,
        elapsed_s=time.monotonic() - started,
        served_version=max((t.version for t in turns[-16:] if t.version is not None), default=0),
        turns=len(turns),
        turns_per_s=users.rate(),
        paused=users.population.paused,
        failures=users.population.failures,
        steps=len(monitor.steps),
        max_steps=max_steps,
        samples_trained=len(monitor.trained),
        waiting=waiting_samples(turns, monitor),
        last_push_ts=monitor.pushes[-1].ts if monitor.pushes else None,
        versions=per_version(turns, scored),
        last_reward=last_reward(monitor.steps),
        sentinels=sentinel or sentinels.Sentinels([], []),
    )


def last_reward(steps: list[dict[str, Any]]) -> float | None:
    """The trainer's last step's reward mean (None before its first step)."""
    value = steps[-1].get("reward_mean") if steps else None
    return float(value) if isinstance(value, (int, float)) else None


class DivergenceWatch:
    """The run's sentinels as its evaluations come in (``evaluation``: the report's, which
    the periodic evaluations fill on this same thread); a WARN line on ``console`` the first
    time each divergence shows. Those ``steps`` and ``evaluation`` already show when the
    watch starts (a phase after learning's) were shown before: not warned of again."""

    def __init__(
        self, console: Console, evaluation: Mapping[str, Any], steps: list[dict[str, Any]]
    ) -> None:
        self.console, self.evaluation = console, evaluation
        self.warned = {d.version for d in sentinels.measure(steps, evaluation).divergence}

    def check(self, steps: list[dict[str, Any]]) -> sentinels.Sentinels:
        found = sentinels.measure(steps, self.evaluation)
        for d in found.divergence:
            if d.version not in self.warned:
                self.warned.add(d.version)
                self.console.print(
                    f"[bold red]WARN[/] divergence at policy version {d.version}: {d.reason} "
                    "(the policy may be pleasing its judge, not answering better)"
                )
        return found


def hold_users(population: Population, action: Callable[[], None]) -> None:
    """``action()`` while no user starts a new session; sessions in flight go on."""
    held = population.allowed
    # The users' thread may take a place just as this reads ``started``: that one session
    # goes on, and no further one starts, since ``paused`` is ``started >= allowed``.
    population.allowed = population.started
    try:
        action()
    finally:
        population.allowed = held


def follow(
    phase: str,
    users: Users,
    monitor: Monitor,
    watched: Watched,
    done: Callable[[], bool],
    console: Console,
    started: float,
    max_steps: int,
    max_ahead: int | None,
    deadline: float,
    on_push: Callable[[int], None] | None = None,
    evaluation: Mapping[str, Any] | None = None,
    batch_size: int | None = None,
) -> None:
    """Live view until ``done()``; at most ``max_ahead`` sessions are ahead of the trainer
    (started, and their sample neither trained nor excluded; a push settles ``batch_size``
    samples a step, see ``settled``). ``on_push(version)`` runs for each push seen, while no
    user starts a session. ``evaluation`` (the report's, filled by ``on_push``) feeds the
    sentinels: a divergence is warned of as it shows."""
    stall = Stall()
    pushes = len(monitor.pushes)
    shared = evaluation if evaluation is not None else {}  # the same dict, filled as it goes
    watch = DivergenceWatch(console, shared, monitor.steps)
    with LiveView(console) as view:
        while True:
            monitor.poll()
            watched.check()
            if users.error is not None:
                raise TurnstreamError(f"the simulated users stopped: {users.error!r}")
            if on_push is not None:
                for push in monitor.pushes[pushes:]:
                    hold_users(users.population, functools.partial(on_push, push.version))
                pushes = len(monitor.pushes)
            if max_ahead is not None:
                pace(users, monitor, max_ahead, stall, batch_size)
            found = watch.check(monitor.steps)
            view.show(snapshot(phase, users, monitor, started, max_steps, found))
            if done():
                return
            if time.monotonic() > deadline:
                raise TurnstreamError(f"the run did not finish {phase} in time")
            time.sleep(FOLLOW_PAUSE_S)


def pace(
    users: Users, monitor: Monitor, max_ahead: int, stall: Stall, batch_size: int | None = None
) -> None:
    """Let users start sessions up to ``max_ahead`` past the settled ones (see ``settled``
    for ``batch_size``); ``stall`` raises when they are held back and nothing moves."""
    turns = users.turns
    count = settled(turns, monitor, batch_size)
    users.population.allowed = count + max_ahead
    progress = (len(turns), count, len(monitor.scored), len(monitor.steps))
    stall.check(users.population.paused, progress, len(turns) - count)
