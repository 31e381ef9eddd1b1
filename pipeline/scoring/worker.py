"""The scoring worker: a Faust app whose two agents pair turns and judge pairs.

- ``pair`` reads chat.turns in order per partition, keeps each session's state
  in the ``sessions`` table and emits pairs to turns.paired;
- ``judge`` reads turns.paired, judges up to ``window`` pairs at once and emits
  their samples (or retry records, or dead letters) in arrival order.

Each agent takes the records already waiting as one burst (``bursts``), and
acknowledges it only once what it produced is stored; the session table's
changelog trails the pairs it implies (``faust_fixes``). The
agents share a :class:`pipeline.scoring.worker_state.Worker`; the timers (idle
sessions, lag, stranded partitions) are in ``upkeep``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import faust
from faust.types import StreamT

from pipeline.deadletters import Out
from pipeline.scoring import metrics, upkeep
from pipeline.scoring.build import build_stage
from pipeline.scoring.faust_app import RawSchema, faust_app, kafka_sender
from pipeline.scoring.faust_fixes.acks import Send
from pipeline.scoring.faust_fixes.guard import OffsetGuard, kafka_guard
from pipeline.scoring.faust_fixes.sessions import SessionTable, SessionWrites
from pipeline.scoring.stages import JudgeStage, PairingStage
from pipeline.scoring.worker_state import Worker
from pipeline.settings import Settings

log = logging.getLogger(__name__)


async def pair(w: Worker, stream: StreamT) -> None:
    """chat.turns -> turns.paired, with the session state in the table."""
    manual = stream.noack()  # type: ignore[attr-defined]
    async with w.acknowledging(manual) as (acks, then):
        async for events in w.bursts(manual):
            outs: list[Out] = []
            writes: SessionWrites = {}  # a session's last state in the burst
            records = await w.records(events)
            for rec in records:
                w.pair_record(rec.value, rec.key, rec.where, rec.partition, outs, writes)
            await acks.add(outs, then(events), w.sessions.persisting(writes), len(records))


async def judge(w: Worker, stream: StreamT) -> None:
    """turns.paired -> samples.scored (or samples.retry, or a dead letter)."""
    manual = stream.noack()  # type: ignore[attr-defined]
    async with w.acknowledging(manual) as (acks, then):
        async for events in w.bursts(manual):
            records = await w.records(events)
            await acks.add(w.judge_records(records), then(events), None, len(records))


def build_app(
    settings: Settings,
    judging: JudgeStage,
    sender: Send | None = None,
    guard: OffsetGuard | None = None,
    on_delivery_failure: Callable[[BaseException], None] | None = None,
) -> faust.App:
    """The Faust app of one scoring worker judging with ``judging`` (:func:`build_stage`);
    ``sender`` replaces the Kafka sends (tests)."""
    s, topics = settings.scoring, settings.topics
    app = faust_app(settings)
    out = {
        spec.name: app.topic(spec.name, partitions=spec.partitions, schema=RawSchema())
        for spec in topics
    }

    send = sender or kafka_sender(app)
    w = Worker(
        settings, app, out[topics.chat_turns.name], PairingStage(topics, s.idle_timeout_s),
        judging,
        SessionTable(app.Table("sessions", default=None, partitions=topics.chat_turns.partitions),
                     send), send, guard, on_delivery_failure,
    )  # fmt: skip
    app.agent(out[topics.chat_turns.name], name="pair")(lambda stream: pair(w, stream))
    app.agent(out[topics.turns_paired.name], name="judge")(lambda stream: judge(w, stream))
    upkeep.install(w)
    return app


def run_worker(settings: Settings, loglevel: str = "info") -> None:
    """Run one scoring worker until it is stopped (SIGINT/SIGTERM)."""
    import mode.loop
    from faust.worker import Worker as FaustWorker

    if settings.scoring.event_loop == "uvloop":
        mode.loop.use("uvloop")  # before anything makes a loop

    from pipeline.broker.topics_check import require_topics

    t = settings.topics
    inputs_and_outputs = (t.chat_turns, t.turns_paired, t.samples_scored, t.samples_retry,
                          t.deadletter)  # fmt: skip
    require_topics(settings, [spec.name for spec in inputs_and_outputs])
    settings.scoring.data_dir.mkdir(parents=True, exist_ok=True)
    judging = build_stage(settings)
    group = settings.topic_prefix + settings.scoring.group_id
    guard = kafka_guard(settings, group, (t.chat_turns.name, t.turns_paired.name))
    app = build_app(settings, judging, guard=guard)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_clients(app: faust.App, **_kw: Any) -> None:
        await judging.close()

    metrics.serve(settings.scoring.web_port, settings.scoring.web_host)
    log.info("judge: %s (%s)", judging.scorer.identity.model_dump(), judging.scorer.kind)
    worker = FaustWorker(app, loglevel=loglevel, quiet=True)
    # Faust's terminal spinner puts the root logger at DEBUG (to spin on every record),
    # so every debug call in faust/aiokafka would build a log record: none here.
    worker.spinner = None
    worker.execute_from_commandline()
