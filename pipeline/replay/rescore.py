"""`turnstream rescore`: judge a range of turns.paired again with another judge.

The pairs go through the same judge and mask stage as the live workers, with
the judge the YAML file describes (backend, URLs, model, m, vote mode, mode),
and the samples land on another topic (``samples.scored.v2`` by default). The
rescore has its own consumer group and commits its progress as it goes, so it
never moves live consumers and an interrupted rescore resumes where it
stopped. A pair the new judge cannot be reached for stops the rescore (it is
not sent to the live retry path); the progress before it is kept. With
``rewards: rewards.yaml`` in the YAML the pairs are scored by those reward
processors, as a worker with ``TURNSTREAM_SCORING_REWARDS`` would (a group is
scored with the members in the same poll of up to 500 records, or at its timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import yaml
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from kafka.admin import NewTopic
from pydantic import ValidationError

from pipeline.broker.bulk import batch_sender, range_consumer
from pipeline.broker.clients import admin_client
from pipeline.broker.reading import TopicRange, read_range
from pipeline.errors import ConfigError, TurnstreamError
from pipeline.scoring.build import build_stage
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pipeline.broker.bulk import BatchSender
    from pipeline.deadletters import Out
    from pipeline.scoring.stages import JudgeStage

Record: TypeAlias = ConsumerRecord[bytes, bytes]  # a record of the range being rescored
POLL_RECORDS = 500  # judged together: a group's members within them are scored at once


@dataclass
class RescoreReport:
    total: int = 0
    scored: int = 0
    dead_lettered: int = 0
    already_done: int = 0
    seconds: float = 0.0


def judge_settings(settings: Settings, path: Path) -> Settings:
    """Settings whose scoring section is overridden by the judge YAML (TURNSTREAM_SCORING_* keys,
    lower case, without the prefix: judge, judge_urls, judge_model, m, vote_mode, mode, ...)."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--judge-config {path}: cannot read it: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--judge-config {path}: expected a mapping of scoring options")
    unknown = set(data) - set(type(settings.scoring).model_fields)
    if unknown:
        raise ConfigError(f"--judge-config {path}: unknown option(s) {sorted(unknown)}")
    try:
        scoring = type(settings.scoring).model_validate({**settings.scoring.model_dump(), **data})
    except ValidationError as exc:
        raise ConfigError(f"--judge-config {path}: {exc}") from exc
    if scoring.judge != "rules" and not scoring.judge_urls:
        raise ConfigError(f"--judge-config {path}: judge {scoring.judge} needs judge_urls")
    return settings.model_copy(update={"scoring": scoring})


def ensure_output_topic(settings: Settings, name: str) -> None:
    """Create the output topic like samples.scored (partitions, configs) if it is missing."""
    spec = settings.topics.samples_scored
    client = admin_client(settings)
    try:
        if name in set(client.list_topics()):
            return
        client.create_topics(
            [NewTopic(name, spec.partitions, spec.replication_factor, topic_configs=spec.configs)]
        )
    finally:
        client.close()


def rescore(
    settings: Settings,
    span: TopicRange,
    output: str,
    group: str,
    progress: Callable[[RescoreReport], None] | None = None,
) -> RescoreReport:
    return asyncio.run(_rescore(settings, span, output, group, progress))


async def _rescore(
    settings: Settings,
    span: TopicRange,
    output: str,
    group: str,
    progress: Callable[[RescoreReport], None] | None,
) -> RescoreReport:
    topics = settings.topics
    if output in {spec.name for spec in topics}:
        raise ConfigError(f"--output-topic {output} is a live pipeline topic; name another one")
    ensure_output_topic(settings, output)
    stage = build_stage(settings)  # `rewards:` in the judge YAML: score with those instead
    report = RescoreReport(total=span.total)
    started = time.monotonic()
    try:
        async with (
            range_consumer(settings, group_id=group) as consumer,
            batch_sender(
                settings, f"rescored samples to {output}", topics.samples_scored.max_message_bytes
            ) as out,
        ):
            todo = await _resume(consumer, span, report)
            window = asyncio.Semaphore(settings.scoring.window)

            async def judged(rec: Record) -> list[Out]:
                async with window:
                    where = f"{rec.topic}/{rec.partition}/{rec.offset}"
                    return await stage.handle(rec.value, rec.key, where)

            async for fetched in read_range(consumer, todo, max_records=POLL_RECORDS):
                records = [r for rs in fetched.values() for r in rs]
                results = await asyncio.gather(*(judged(r) for r in records))
                offsets, failure = await _send_judged(stage, out, output, records, results, report)
                await out.flush()
                if offsets:
                    await consumer.commit(offsets)
                report.seconds = time.monotonic() - started
                if progress:
                    progress(report)
                if failure is not None:
                    raise TurnstreamError(
                        f"the judge could not be reached for {failure.topic}/{failure.partition}/"
                        f"{failure.offset}; {report.scored} sample(s) written to {output}, "
                        "progress committed; run the same command again to resume"
                    )
    finally:
        await stage.close()
    report.seconds = time.monotonic() - started
    return report


async def _send_judged(
    stage: JudgeStage,
    out: BatchSender,
    output: str,
    records: list[Record],
    results: list[list[Out]],
    report: RescoreReport,
) -> tuple[dict[TopicPartition, int], Record | None]:
    """Send one poll's outputs (samples to ``output``, dead letters to theirs) and count them.

    Returns the offsets to commit and the first record the judge could not be reached for:
    a partition's records from that one on are neither sent nor committed.
    """
    commit: dict[TopicPartition, int | None] = {}
    failure: Record | None = None
    for rec, outs in zip(records, results, strict=True):
        tp = TopicPartition(rec.topic, rec.partition)
        if tp in commit and commit[tp] is None:
            continue  # an earlier record of this partition could not be judged
        if any(o.topic == stage.retry_topic for o in outs):
            commit[tp] = None
            failure = failure or rec
            continue
        for o in outs:
            topic = output if o.topic == stage.scored_topic else o.topic
            await out.add_keyed(topic, o.key, o.value)
            if o.topic == stage.scored_topic:
                report.scored += 1
            else:
                report.dead_lettered += 1
        commit[tp] = rec.offset + 1
    return {tp: o for tp, o in commit.items() if o}, failure


async def _resume(
    consumer: AIOKafkaConsumer, span: TopicRange, report: RescoreReport
) -> TopicRange:
    """``span`` from where this rescore's group committed (what was done before is counted)."""
    spans = {}
    for p, (start, end) in span.spans.items():
        committed = await consumer.committed(TopicPartition(span.topic, p))
        position = min(max(start, committed or 0), max(start, end))
        report.already_done += position - start
        spans[p] = (position, end)
    return TopicRange(span.topic, spans)
