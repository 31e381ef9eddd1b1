"""What the scoring agents do with one record, minus the Kafka I/O.

Each stage turns one input record into the records to send (``Out``), so the
Faust agents stay a loop that awaits one function and sends its result, and
the logic is tested without a broker. Nothing read is dropped silently: every
record becomes a pair, a sample, a retry, a dead letter, or a counted no-op.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.deadletters import DeadLetters, Out
from pipeline.errors import EventDecodeError
from pipeline.events import (
    JudgeIdentity,
    Paired,
    RetryRecord,
    Sample,
    decode_as,
    decode_input,
    encode,
)
from pipeline.judge.client import JudgeUnavailable
from pipeline.rewards.quality import LengthBias
from pipeline.scoring import metrics
from pipeline.scoring.pairing import SessionState, pair_step
from pipeline.scoring.samples import build_sample
from pipeline.scoring.scorers import PairScorer
from pipeline.topics import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairResult:
    session_id: str | None
    state: dict[str, Any] | None  # the session's new state; None with forget=True deletes it
    forget: bool
    outs: list[Out]
    outcome: str


class PairingStage:
    """chat.turns record -> state change + pairs for turns.paired (or a dead letter)."""

    def __init__(self, topics: Topics, idle_timeout_s: float) -> None:
        self.paired_topic = topics.turns_paired.name
        self.dead = DeadLetters(topics)
        self.idle_timeout_s = idle_timeout_s

    def handle(
        self,
        raw: bytes | None,
        key: bytes | None,
        source: str,
        lookup: Callable[[str], dict[str, Any] | None],
        now: float | None = None,
    ) -> PairResult:
        try:
            event = decode_input(raw)
        except EventDecodeError as exc:
            return self._reject(str(exc), source, raw)
        if key is not None and key != event.session_id.encode():
            return self._reject(
                f"record key {key[:80]!r} is not the event's session_id "
                f"{event.session_id!r}; produce with key = session_id",
                source,
                raw,
            )
        now = time.time() if now is None else now
        step = pair_step(
            SessionState.from_dict(lookup(event.session_id)), event, now, self.idle_timeout_s
        )
        metrics.child(metrics.EVENTS, step.outcome).inc()
        if step.outcome == "out_of_order":
            return PairResult(
                None,
                None,
                False,
                [self.dead("pair", step.reject_reason or "", source, raw)],
                step.outcome,
            )
        outs = []
        for pair in step.pairs:
            metrics.child(metrics.PAIRED, str(pair.next_state is not None).lower()).inc()
            # a turn and its next state can each be near chat.turns' limit
            out = Out(self.paired_topic, pair.route_key, encode(pair))
            outs.append(self.dead.unless_fits("pair", out, f"the pair of {pair.sample_id}", source))
        state = step.state.to_dict() if step.state else None
        return PairResult(event.session_id, state, step.state is None, outs, step.outcome)

    def _reject(self, error: str, source: str, raw: bytes | None) -> PairResult:
        metrics.child(metrics.EVENTS, "invalid").inc()
        return PairResult(None, None, False, [self.dead("pair", error, source, raw)], "invalid")


class JudgeStage:
    """turns.paired record -> scored sample, retry record, or dead letter."""

    def __init__(self, topics: Topics, scorer: PairScorer) -> None:
        self.scored_topic = topics.samples_scored.name
        self.retry_topic = topics.samples_retry.name
        self.dead = DeadLetters(topics)
        self.scorer = scorer
        # judge quality: does the score grow with response length? (judged pairs only)
        self.length_bias = LengthBias(processor=scorer.kind)

    async def close(self) -> None:
        await self.scorer.close()

    async def handle(self, raw: bytes | None, key: bytes | None, source: str) -> list[Out]:
        try:
            paired = decode_as(Paired, raw)
        except EventDecodeError as exc:
            return [self.dead("score", str(exc), source, raw)]
        if paired.exclude_reason is not None:  # a failed rollout's turn: recorded, not judged
            return [self._sample_out(excluded_sample(paired, self.scorer.identity), source)]
        metrics.IN_FLIGHT.inc()
        try:
            sample = await self.scorer.score(paired)
        except JudgeUnavailable as exc:
            metrics.RETRIES.inc()
            record = RetryRecord(
                paired=paired, error=str(exc), attempts=paired.attempt, failed_ts=time.time()
            )
            out = Out(self.retry_topic, paired.route_key, encode(record))
            return [self.dead.unless_fits("score", out, f"the retry of {paired.sample_id}", source)]
        except Exception as exc:  # a bug must not lose the record: keep it, with the trace
            log.exception("scoring %s failed", paired.sample_id)
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            return [self.dead("score", f"unexpected error: {detail}", source, raw)]
        finally:
            metrics.IN_FLIGHT.dec()
        if sample.next_state is not None:
            self.length_bias.observe(sample.score, len(sample.response.content or ""))
        return [self._sample_out(with_rollout_metrics(sample, paired), source)]

    def _sample_out(self, sample: Sample, source: str) -> Out:
        record_sample_metrics(sample)
        out = Out(self.scored_topic, sample.session_id.encode(), encode(sample))
        return self.dead.unless_fits("score", out, f"the sample of {sample.sample_id}", source)


def excluded_sample(paired: Paired, identity: JudgeIdentity) -> Sample:
    """The sample of a pair the pairing stage excluded: loss_mask 0, no judge call."""
    reason = paired.exclude_reason
    sample = build_sample(paired, identity, "rl", None, None, 0.0)
    return sample.model_copy(update={"loss_mask": 0, "exclude_reason": reason})


def with_rollout_metrics(sample: Sample, paired: Paired) -> Sample:
    """``sample`` with its rollout's metrics in ``reward_metrics``, as ``rollout/<name>``."""
    if not paired.rollout_metrics:
        return sample
    named = {f"rollout/{k}": v for k, v in paired.rollout_metrics.items()}
    return sample.model_copy(update={"reward_metrics": {**sample.reward_metrics, **named}})


def record_sample_metrics(sample: Sample) -> None:
    for vote in sample.votes:
        metrics.child(metrics.VOTES, "failed" if vote is None else str(vote)).inc()
    metrics.JUDGE_CALLS.observe(sample.judge_calls)
    metrics.JUDGE_LATENCY.observe(sample.timings.get("judge_s", 0.0))
    metrics.child(metrics.SCORES, f"{sample.score:g}", sample.exclude_reason or "none").inc()
