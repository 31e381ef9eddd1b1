"""The scoring worker: a Faust app with a pairing agent and a judging agent.

- ``pair`` reads chat.turns in order per partition, keeps each session's state
  in the ``sessions`` table (changelog-backed, written only once the pairs a
  state change implies are stored: pipeline.scoring.sessions), and emits pairs.
- ``judge`` reads turns.paired and keeps up to ``window`` pairs being judged at
  once, emitting and acknowledging them in arrival order, so offsets are
  committed only for records whose result was delivered.
- a timer flushes sessions idle for longer than ``idle_timeout_s`` by writing
  a ``session_end`` (reason ``idle_timeout``) to chat.turns: the decision is on
  the log, and the pairing agent applies it in order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.types import TP, StreamT

from pipeline.errors import ConfigError
from pipeline.events import SessionEnd, encode
from pipeline.scoring import metrics
from pipeline.scoring.delivery import Durable, InOrderAcks, Then
from pipeline.scoring.guard import OffsetGuard, Record, kafka_guard
from pipeline.scoring.handover import Handled, commit_handed_over, commit_idle
from pipeline.scoring.judge.client import JudgeClient, JudgeConfig
from pipeline.scoring.score import HttpJudge, Judge, RulesJudge, judge_identity
from pipeline.scoring.sessions import SessionTable
from pipeline.scoring.stages import JudgeStage, Out, PairingStage
from pipeline.scoring.teacher import PolicyTokenizer, Teacher
from pipeline.settings import Settings
from pipeline.topics.offsets import group_lag

log = logging.getLogger(__name__)

STRANDED_CHECK_S = 5.0  # how long a partition may hold records nobody delivers, while idle


def faust_credentials(settings: Settings) -> Any:
    """Faust broker credentials from the same KAFKA_* settings every client uses."""
    k = settings.kafka
    context = None
    if k.security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=str(k.ssl_cafile) if k.ssl_cafile else None)
        if k.ssl_certfile:
            context.load_cert_chain(str(k.ssl_certfile), str(k.ssl_keyfile or "") or None)
        context.check_hostname = k.ssl_check_hostname
    if k.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password.get_secret_value() if k.sasl_password else None,
            mechanism=k.sasl_mechanism,
            ssl_context=context,
        )
    return faust.SSLCredentials(context) if context else None


def build_judge(settings: Settings) -> tuple[Judge, Teacher | None]:
    """The configured judge, and the OPD teacher when the mode needs one."""
    s = settings.scoring
    if s.judge == "rules":
        if s.mode != "rl":
            log.warning("the rules judge gives hints but no teacher log-probs (mode %s)", s.mode)
        return RulesJudge(), None
    render = _chat_renderer(s.judge_tokenizer) if s.judge == "sglang" else None
    config = JudgeConfig(
        backend=s.judge,
        urls=s.judge_urls,
        model=s.judge_model,
        api_key=s.judge_api_key.get_secret_value() if s.judge_api_key else None,
        timeout_s=s.judge_timeout_s,
        max_attempts=s.judge_max_attempts,
        concurrency=s.judge_concurrency,
    )
    client = JudgeClient(config, render) if render else JudgeClient(config)
    identity = judge_identity(s.judge, s.judge_model, list(s.judge_urls))
    judge = HttpJudge(client, identity, m=s.m, vote_mode=s.vote_mode, hint_m=s.hint_m)
    teacher = None
    if s.mode in ("opd", "combine"):
        if s.judge != "sglang":
            raise ConfigError(
                f"--mode {s.mode} needs teacher log-probs from SGLang /generate: use --judge sglang"
            )
        if s.policy_tokenizer is None:
            raise ConfigError(
                f"--mode {s.mode} needs TURNSTREAM_SCORING_POLICY_TOKENIZER (a local "
                "tokenizer directory) to build the teacher prompt"
            )
        teacher = Teacher(client, PolicyTokenizer(s.policy_tokenizer), s.teacher_top_k)
    return judge, teacher


def _chat_renderer(tokenizer_path: Any) -> Any:
    """The judge model's chat template from a local tokenizer, or ChatML without one."""
    if tokenizer_path is None:
        log.warning("no judge tokenizer configured: SGLang prompts use a ChatML template")
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
    return lambda messages: tok.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True
    )


# Sends outputs; returns what resolves once each is delivered (a test sink may return None).
Sender = Callable[[list[Out]], Awaitable[list[Any] | None]]


async def _exit_undelivered(app: faust.App, handled: Handled, exc: BaseException) -> None:
    """Stop this worker after an output was refused: commit what was delivered, then exit 1.

    Not a graceful stop: Faust's waits for its unacknowledged records to be
    acknowledged, and the ones behind the refused output never will be. Whoever
    takes the partitions reads them again from the commit.
    """
    log.error("stopping the worker: an output could not be delivered (%r)", exc)
    try:
        assigned = app.consumer.assignment()
        await asyncio.wait_for(commit_handed_over(app, handled, assigned, timeout_s=10), 15)
    except Exception as commit_exc:  # the broker may be the problem: the last commit stands
        log.warning("could not commit the delivered positions before stopping: %r", commit_exc)
    sys.stderr.write(
        f"error: stopped: an output could not be delivered to Kafka ({exc!r}); "
        "its input and everything after it are read again from the last commit\n"
    )
    sys.stderr.flush()
    logging.shutdown()
    os._exit(1)


def build_app(
    settings: Settings,
    judge: Judge,
    sender: Sender | None = None,
    teacher: Teacher | None = None,
    guard: OffsetGuard | None = None,
    rewards: Any = None,
    groups: Any = None,
    on_delivery_failure: Callable[[BaseException], Any] | None = None,
) -> faust.App:
    """The Faust app of one scoring worker (agents, table, timer).

    ``sender`` replaces the Kafka sends (tests observe the agents' output with it);
    ``guard`` reads back records the Faust stream skipped (see pipeline.scoring.guard);
    ``rewards`` (a set-up reward processor) scores pairs in place of the judge;
    ``groups`` (a pipeline.rewards.GroupScorer) scores grouped turns together.
    Each agent acknowledges a record only once its outputs are delivered
    (pipeline.scoring.delivery); a failed one ends the worker process (exit 1),
    or is handed to ``on_delivery_failure`` when given.
    """
    s, topics = settings.scoring, settings.topics
    app = faust.App(
        settings.topic_prefix + s.group_id,
        broker=[f"kafka://{hp}" for hp in settings.bootstrap_servers.split(",")],
        broker_credentials=faust_credentials(settings),
        store="memory://",
        datadir=str(s.data_dir),
        web_enabled=False,
        topic_partitions=topics.chat_turns.partitions,
        topic_replication_factor=topics.chat_turns.replication_factor,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=topics.samples_scored.max_message_bytes,
        producer_linger=settings.producer_linger_ms / 1000,
        consumer_max_fetch_size=topics.samples_scored.max_message_bytes,
        stream_buffer_maxsize=max(64, s.window),
    )
    raw: dict[str, Any] = {
        "key_type": bytes,
        "value_type": bytes,
        "key_serializer": "raw",
        "value_serializer": "raw",
    }
    turns = app.topic(topics.chat_turns.name, partitions=topics.chat_turns.partitions, **raw)
    paired = app.topic(topics.turns_paired.name, partitions=topics.turns_paired.partitions, **raw)
    outputs = {
        spec.name: app.topic(spec.name, partitions=spec.partitions, **raw)
        for spec in (
            topics.turns_paired,
            topics.samples_scored,
            topics.samples_retry,
            topics.deadletter,
        )
    }
    sessions = SessionTable(
        app.Table("sessions", default=None, partitions=topics.chat_turns.partitions)
    )
    pairing = PairingStage(topics, s.idle_timeout_s)
    judging = JudgeStage(topics, judge, s.mode, teacher, rewards=rewards, groups=groups)

    async def send_to_kafka(outs: list[Out]) -> list[Any]:
        # each send returns once buffered; its future resolves when the broker has it
        return [await outputs[o.topic].send(key=o.key, value=o.value) for o in outs]

    send = sender or send_to_kafka

    async def recovered(message: Any) -> list[Record]:
        if guard is None:
            return []
        return await guard.missing(message.topic, message.partition, message.offset)

    if guard is not None:

        @app.on_partitions_assigned.connect  # type: ignore[arg-type]
        async def forget_positions(_app: faust.App, assigned: Any = (), **_kw: Any) -> None:
            guard.reset({(tp.topic, tp.partition) for tp in assigned})

    handled = Handled()
    busy = [0]  # events the agents are handling now (Faust keeps a stream's last one unacked)

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def hand_over(_app: faust.App, revoked: Any = (), **_kw: Any) -> None:
        await commit_handed_over(_app, handled, revoked)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def forget_elsewhere(_app: faust.App, assigned: Any = (), **_kw: Any) -> None:
        handled.keep_only({(tp.topic, tp.partition) for tp in assigned})

    stopping: list[asyncio.Future[None]] = []

    def undelivered(exc: BaseException) -> None:
        if on_delivery_failure is not None:
            on_delivery_failure(exc)
        elif not stopping:
            stopping.append(asyncio.ensure_future(_exit_undelivered(app, handled, exc)))

    def acknowledger(stream: Any) -> tuple[InOrderAcks, Callable[[Any], Then]]:
        """Acks of one agent, each once the outputs of its record are delivered."""
        acks = InOrderAcks(s.window, undelivered)

        def then(event: Any) -> Then:
            async def ack() -> None:
                if event is not None:  # None: a record the guard read back (no Faust ack)
                    await stream.ack(event)
                    m = event.message
                    handled.done(m.topic, m.partition, m.offset)
                busy[0] -= 1

            return ack

        return acks, then

    async def delivered(outs: list[Out]) -> list[Any]:
        try:
            return list(await send(outs) or [])
        except Exception as exc:  # refused before it was even buffered: stop like a failure
            undelivered(exc)
            raise

    @app.agent(turns, name="pair")
    async def pair(stream: StreamT) -> None:
        manual = stream.noack()  # type: ignore[attr-defined]
        acks, then = acknowledger(manual)

        async def apply(
            raw: bytes | None, key: bytes | None, where: str, partition: int, writes: list[Any]
        ) -> list[Any]:
            result = pairing.handle(raw, key, where, sessions.get)
            if result.session_id is not None:
                state = None if result.forget else result.state
                sessions.set(result.session_id, state)
                writes.append((partition, result.session_id, state))
            return await delivered(result.outs)

        acker = asyncio.ensure_future(acks.run())
        try:
            async for event in manual.events():
                busy[0] += 1  # until its acknowledgement
                try:
                    deliveries: list[Any] = []
                    writes: list[tuple[int, str, dict[str, Any] | None]] = []
                    for rec in await recovered(event.message):
                        deliveries += await apply(
                            rec.value, rec.key, rec.where, rec.partition, writes
                        )
                    m = event.message
                    deliveries += await apply(
                        event.value, event.key, _where(m), m.partition, writes
                    )
                    # the session states go to the changelog once the pairs they imply are stored
                    await acks.add(deliveries, then(event), _persisting(sessions, writes))
                except BaseException:
                    busy[0] -= 1
                    raise
        finally:
            acker.cancel()
            busy[0] -= acks.drop()

    @app.agent(paired, name="judge")
    async def judge_agent(stream: StreamT) -> None:
        manual = stream.noack()  # type: ignore[attr-defined]
        acks, then = acknowledger(manual)
        window: asyncio.Queue[tuple[Any, asyncio.Future[list[Out]]]] = asyncio.Queue(s.window)

        async def emit_in_order() -> None:
            while True:
                event, task = await window.get()
                try:
                    deliveries = await delivered(await task)
                    await acks.add(deliveries, then(event))
                except BaseException:
                    busy[0] -= 1
                    raise

        async def admit(event: Any, raw: bytes | None, key: bytes | None, where: str) -> None:
            busy[0] += 1  # until its acknowledgement
            task = asyncio.ensure_future(judging.handle(raw, key, where))
            put = asyncio.ensure_future(window.put((event, task)))
            await asyncio.wait({put, emitter}, return_when=asyncio.FIRST_COMPLETED)
            if emitter.done():  # sending failed: stop here, unacked records are re-read
                put.cancel()
                task.cancel()
                busy[0] -= 1
                emitter.result()

        emitter = asyncio.ensure_future(emit_in_order())
        acker = asyncio.ensure_future(acks.run())
        try:
            async for event in manual.events():
                for rec in await recovered(event.message):
                    await admit(None, rec.value, rec.key, rec.where)
                await admit(event, event.value, event.key, _where(event.message))
        finally:
            emitter.cancel()
            acker.cancel()
            while not window.empty():
                window.get_nowait()[1].cancel()
                busy[0] -= 1
            busy[0] -= acks.drop()

    if guard is not None:

        @app.timer(interval=STRANDED_CHECK_S)
        async def unstrand() -> None:
            # While nothing is in flight: commit what was handled where Faust's commit
            # is stuck in front of records the guard read back for it; and seek back to
            # records the stream dropped at the end of a partition (faust-streaming can
            # drop records it had fetched when a rebalance lands), which no later record
            # reveals.
            consumer = app.consumer
            if app.rebalancing or busy[0]:
                return
            sources = {topics.chat_turns.name, topics.turns_paired.name}
            highwaters = {}
            assigned = set()
            for tp in consumer.assignment():
                if tp.topic in sources:
                    assigned.add((tp.topic, tp.partition))
                    if (end := consumer.highwater(tp)) is not None:
                        highwaters[(tp.topic, tp.partition)] = end
            await commit_idle(app, handled, assigned)
            for (topic, partition), offset in (
                await guard.stranded(highwaters, STRANDED_CHECK_S)
            ).items():
                log.warning(
                    "%s/%d: no records since offset %d, below its end %d: reading from there",
                    topic,
                    partition,
                    offset,
                    highwaters[(topic, partition)],
                )
                metrics.STRANDED_SEEKS.labels(topic).inc()
                await consumer.seek(TP(topic, partition), offset)

    @app.timer(interval=10.0)
    async def report_lag() -> None:
        group = settings.topic_prefix + s.group_id
        for spec in (topics.chat_turns, topics.turns_paired):
            lag = await asyncio.to_thread(group_lag, settings, group, [spec.name])
            if lag is not None:
                metrics.LAG.labels(spec.logical).set(lag)

    flagged: dict[str, float] = {}

    @app.timer(interval=s.idle_check_interval_s)
    async def idle_sweep() -> None:
        now = time.time()
        for session_id, state in list(sessions.items()):
            # An idle session is ended on the log: a pending turn is flushed without a
            # next state, and a session with nothing pending is forgotten.
            if not state or now - state["last_seen"] <= s.idle_timeout_s:
                continue
            if now - flagged.get(session_id, 0.0) < s.idle_timeout_s:
                continue  # already asked; the pairing agent will apply it
            end = SessionEnd(
                type="session_end", session_id=session_id, ts=now, reason="idle_timeout"
            )
            await turns.send(key=session_id.encode(), value=encode(end))
            flagged[session_id] = now
        for session_id, when in list(flagged.items()):
            if now - when > 2 * s.idle_timeout_s:
                del flagged[session_id]

    return app


def _persisting(sessions: SessionTable, writes: list[tuple[int, str, Any]]) -> Durable | None:
    """The durable step of one input: its session-state changes, in order."""
    if not writes:
        return None
    return lambda: [sessions.persist(partition, sid, state) for partition, sid, state in writes]


def _where(message: Any) -> str:
    return f"{message.topic}/{message.partition}/{message.offset}"


def load_rewards(settings: Settings) -> Any:
    """The rewards of ``TURNSTREAM_SCORING_REWARDS`` (a RewardPlan), set up; None when unset."""
    path = settings.scoring.rewards
    if path is None:
        return None
    if settings.scoring.mode != "rl":
        raise ConfigError(
            f"TURNSTREAM_SCORING_REWARDS={path}: reward processors score in rl mode only "
            f"(TURNSTREAM_SCORING_MODE is {settings.scoring.mode})"
        )
    from pipeline.rewards.combine import load_plan

    plan = load_plan(path)
    group = plan.group
    if group is not None and group.size is not None and group.size > settings.scoring.window:
        raise ConfigError(
            f"{path}: group.size {group.size} is larger than TURNSTREAM_SCORING_WINDOW "
            f"({settings.scoring.window}): a group's members wait in the judging window, "
            "so it must hold a whole group; raise the window or lower the size"
        )
    plan.setup()
    log.info("scoring with the rewards of %s", path)
    return plan


def run_worker(settings: Settings, loglevel: str = "info") -> None:
    """Run one scoring worker until it is stopped (SIGINT/SIGTERM)."""
    from faust.worker import Worker

    from pipeline.produce.producer import require_topics

    topics = settings.topics
    require_topics(
        settings,
        [
            t.name
            for t in (
                topics.chat_turns,
                topics.turns_paired,
                topics.samples_scored,
                topics.samples_retry,
                topics.deadletter,
            )
        ],
    )
    settings.scoring.data_dir.mkdir(parents=True, exist_ok=True)
    judge, teacher = build_judge(settings)
    group = settings.topic_prefix + settings.scoring.group_id
    plan = load_rewards(settings)
    app = build_app(
        settings,
        judge,
        teacher=teacher,
        guard=kafka_guard(settings, group),
        rewards=plan.processor if plan else None,
        groups=plan.group.scorer(judge.identity) if plan and plan.group else None,
    )
    client = getattr(judge, "client", None)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def close_judge_client(app: faust.App, **_kw: Any) -> None:
        if client is not None:
            await client.close()
        if plan is not None:
            await plan.close()

    metrics.serve(settings.scoring.web_port, settings.scoring.web_host)
    log.info("judge: %s", judge.identity.model_dump())
    worker = Worker(app, loglevel=loglevel, quiet=True)
    # Faust's terminal spinner puts the root logger at DEBUG (to spin on every record),
    # so every debug call in faust/aiokafka would build a log record: none here.
    worker.spinner = None
    worker.execute_from_commandline()
