"""The scoring worker's timers and rebalance hooks: idle sessions, lag, stranded partitions.

- idle sessions: a session silent for ``idle_timeout_s`` is ended on the log
  (a ``session_end`` with reason ``idle_timeout`` on chat.turns), so the
  pairing agent applies the decision in order;
- lag: records behind on each input topic for this worker's partitions, from
  its own consumer (no extra Kafka clients);
- the Faust repairs that run on a timer or a rebalance (``faust_fixes``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import faust
from faust.types import TP

from pipeline.events import SessionEnd, encode
from pipeline.scoring import metrics
from pipeline.scoring.faust_fixes import adapter
from pipeline.scoring.faust_fixes.handover import commit_ahead, commit_handed_over, exit_now
from pipeline.scoring.worker_state import Worker

log = logging.getLogger(__name__)

STRANDED_CHECK_S = 5.0  # how long a partition may hold records nobody delivers, while idle
LAG_EVERY_S = 10.0
COMMIT_AHEAD_S = 1.0  # commits what Faust's commit is stuck behind (read-back records)
CRASH_CHECK_S = 1.0  # how often the worker looks for a crashed app or fetcher
HANDOVER_WAIT_S = 5.0  # on a revoke, for the agents to acknowledge what they are finishing


def install(w: Worker) -> None:
    """Connect the rebalance hooks and start the timers of ``w``'s app."""
    app, s = w.app, w.settings.scoring
    flagged: dict[str, float] = {}

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def hand_over(_app: faust.App, revoked: Iterable[TP] = (), **_kw: Any) -> None:
        await commit_handed_over(_app, w.handled, revoked, lambda: w.settled(HANDOVER_WAIT_S))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def forget_elsewhere(_app: faust.App, assigned: Iterable[TP] = (), **_kw: Any) -> None:
        kept = {(tp.topic, tp.partition) for tp in assigned}
        w.handled.keep_only(kept)
        if w.guard is not None:
            w.guard.reset(kept)

    @app.timer(interval=s.idle_check_interval_s)
    async def idle_sweep() -> None:
        await end_idle_sessions(w, flagged, time.time())

    @app.timer(interval=LAG_EVERY_S)
    async def report_lag() -> None:
        for topic, lag in consumer_lag(w).items():
            metrics.LAG.labels(topic).set(lag)

    @app.timer(interval=COMMIT_AHEAD_S)
    async def commit_past_faust() -> None:
        if not w.app.rebalancing:
            await commit_ahead(w.app, w.handled, sources(w))

    @app.task
    async def watch() -> None:  # the app's own timers stop when it crashes: a loop timer
        watch_for_crash(w, CRASH_CHECK_S)

    if w.guard is not None:

        @app.timer(interval=STRANDED_CHECK_S)
        async def unstrand() -> None:
            await seek_stranded(w)


def watch_for_crash(w: Worker, every_s: float) -> None:
    """Every ``every_s``, on the event loop itself (not a timer of the app, which stops
    when the app crashes): exit once the app or its fetcher crashed."""
    if not stop_if_crashed(w):
        asyncio.get_running_loop().call_later(every_s, watch_for_crash, w, every_s)


def stop_if_crashed(w: Worker) -> bool:
    """Exit (1) when Faust's fetcher, or the app, crashed: Faust logs it and the process
    stays up reading nothing; exited, its partitions go to a worker that reads."""
    crash = adapter.fetcher_crash(w.app) or (w.app.crash_reason if w.app.crashed else None)
    if crash is None:
        return False
    if not w.stopping:
        why = (f"Faust crashed ({crash!r}) and would deliver nothing more; whoever takes "
               "the partitions reads on from the last commit")  # fmt: skip
        w.stopping.append(asyncio.ensure_future(exit_now(w.app, w.handled, why)))
    return True


async def end_idle_sessions(w: Worker, flagged: dict[str, float], now: float) -> None:
    """Write a ``session_end`` for each session idle past its timeout (once per timeout)."""
    timeout = w.settings.scoring.idle_timeout_s
    for session_id, state in w.sessions.items():
        if not state or now - state["last_seen"] <= timeout:
            continue
        if now - flagged.get(session_id, 0.0) < timeout:
            continue  # already asked; the pairing agent will apply it
        end = SessionEnd(type="session_end", session_id=session_id, ts=now, reason="idle_timeout")
        await w.turns.send(key=session_id.encode(), value=encode(end))
        flagged[session_id] = now
    for session_id, when in list(flagged.items()):
        if now - when > 2 * timeout:
            del flagged[session_id]


def consumer_lag(w: Worker) -> dict[str, int]:
    """Records behind on chat.turns and turns.paired, over this worker's partitions."""
    topics = w.settings.topics
    names = {topics.chat_turns.name: topics.chat_turns.logical,
             topics.turns_paired.name: topics.turns_paired.logical}  # fmt: skip
    lag = dict.fromkeys(names.values(), 0)
    consumer = w.app.consumer
    for tp in consumer.assignment():
        if tp.topic in names and (end := consumer.highwater(tp)) is not None:
            lag[names[tp.topic]] += max(0, end - adapter.committed_offset(consumer, tp))
    return lag


def sources(w: Worker) -> set[tuple[str, int]]:
    """The partitions of chat.turns and turns.paired this worker holds."""
    names = {w.settings.topics.chat_turns.name, w.settings.topics.turns_paired.name}
    return {(tp.topic, tp.partition) for tp in w.app.consumer.assignment() if tp.topic in names}


async def seek_stranded(w: Worker) -> None:
    """While nothing is in flight: seek back to records a partition's stream stopped short
    of (the guard notices skipped records when a later one arrives; these have none)."""
    assert w.guard is not None
    consumer = w.app.consumer
    if w.app.rebalancing or w.in_flight:
        return
    highwaters = {}
    for topic, partition in sources(w):
        if (end := consumer.highwater(TP(topic, partition))) is not None:
            highwaters[(topic, partition)] = end
    for (topic, partition), offset in (
        await w.guard.stranded(highwaters, STRANDED_CHECK_S)
    ).items():
        log.warning(
            "%s/%d: no records since offset %d, below its end %d: reading from there",
            topic, partition, offset, highwaters[(topic, partition)],
        )  # fmt: skip
        metrics.STRANDED_SEEKS.labels(topic).inc()
        await adapter.seek(consumer, TP(topic, partition), offset)
