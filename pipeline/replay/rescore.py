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
from typing import Any

import yaml
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.admin import NewTopic
from pydantic import ValidationError

from pipeline.broker.clients import admin_client, consumer_config, flush_or_raise, producer
from pipeline.errors import ConfigError, TurnstreamError
from pipeline.replay.ranges import TopicRange
from pipeline.settings import Settings


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
    from pipeline.scoring.judge.factory import build_judge, load_rewards
    from pipeline.scoring.stages import JudgeStage

    topics = settings.topics
    if output in {spec.name for spec in topics}:
        raise ConfigError(f"--output-topic {output} is a live pipeline topic; name another one")
    ensure_output_topic(settings, output)
    judge, teacher = build_judge(settings)
    plan = load_rewards(settings)  # `rewards:` in the judge YAML: score with those instead
    stage = JudgeStage(
        topics,
        judge,
        settings.scoring.mode,
        teacher,
        rewards=plan.processor if plan else None,
        groups=plan.group.scorer(judge.identity) if plan and plan.group else None,
    )
    consumer = KafkaConsumer(**consumer_config(settings, group))
    out = producer(settings, max_request_size=topics.samples_scored.max_message_bytes)
    report = RescoreReport(total=span.total)
    started = time.monotonic()
    try:
        tps = {
            TopicPartition(span.topic, p): (start, end)
            for p, (start, end) in span.spans.items()
            if end > start
        }
        consumer.assign(list(tps))
        for tp, (start, _end) in tps.items():
            committed = consumer.committed(tp)
            position = max(start, committed or 0)
            report.already_done += min(position, tps[tp][1]) - start
            consumer.seek(tp, position)
        window = asyncio.Semaphore(settings.scoring.window)

        async def judged(rec: Any) -> list[Any]:
            async with window:
                where = f"{rec.topic}/{rec.partition}/{rec.offset}"
                return await stage.handle(rec.value, rec.key, where)

        while any(consumer.position(tp) < end for tp, (_s, end) in tps.items()):
            batch = await asyncio.to_thread(consumer.poll, 1000, 500)
            records = [r for tp, rs in batch.items() for r in rs if r.offset < tps[tp][1]]
            results = await asyncio.gather(*(judged(r) for r in records))
            sent: list[Any] = []
            commit: dict[TopicPartition, int | None] = {}
            failure: tuple[Any, Any] | None = None
            for rec, outs in zip(records, results, strict=True):
                tp = TopicPartition(rec.topic, rec.partition)
                if tp in commit and commit[tp] is None:
                    continue  # an earlier record of this partition could not be judged
                if any(o.topic == stage.retry_topic for o in outs):
                    commit[tp] = None
                    failure = failure or (rec, outs)
                    continue
                for o in outs:
                    topic = output if o.topic == stage.scored_topic else o.topic
                    sent.append(out.send(topic, key=o.key, value=o.value))
                    if o.topic == stage.scored_topic:
                        report.scored += 1
                    else:
                        report.dead_lettered += 1
                commit[tp] = rec.offset + 1
            flush_or_raise(out, sent, f"rescored samples to {output}")
            offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in commit.items() if o}
            if offsets:
                consumer.commit(offsets)
            report.seconds = time.monotonic() - started
            if progress:
                progress(report)
            if failure is not None:
                rec, _outs = failure
                raise TurnstreamError(
                    f"the judge could not be reached for {rec.topic}/{rec.partition}/"
                    f"{rec.offset}; {report.scored} sample(s) written to {output}, progress "
                    "committed; run the same command again to resume"
                )
            for tp, (_s, end) in tps.items():
                if consumer.position(tp) >= end:
                    consumer.pause(tp)
    finally:
        out.close()
        consumer.close()
        client = getattr(judge, "client", None)
        if client is not None:
            await client.close()
        if plan is not None:
            await plan.close()
    report.seconds = time.monotonic() - started
    return report
