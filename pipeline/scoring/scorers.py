"""What the judging stage asks about each pair, and the scorers that answer it.

:class:`PairScorer` is the judging stage's one interface: a pair in, its
scored sample out, :class:`~pipeline.judge.client.JudgeUnavailable` for
transient trouble (the pair goes to ``samples.retry``; it never becomes a
score). :class:`PrmScorer` is the PRM judge with the votes the mode needs;
:class:`ProcessorScorer` the reward processors of ``TURNSTREAM_SCORING_REWARDS``;
:class:`~pipeline.scoring.groups.GroupScorer` a group reward (an ungrouped
turn is a group of one), and :class:`ByGroup` sends grouped turns to it and
the rest to the processors.

With reward processors the reward SDK's rules hold: FAILED is a transient
failure and goes to ``samples.retry`` like an unreachable judge
(``turnstream retry`` re-queues it, then dead-letters it after its attempts);
any SUCCESS score, 0 included, is a training signal (loss mask 1). A turn with
no next state is not scored and stays excluded (``no_next_state``), except a
successful rollout's final turn: the processors score the whole rollout on it
(its messages and the task's ground truth), as the reward SDK's rollouts are.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pipeline.events import JudgeIdentity, Paired, Sample
from pipeline.judge.asking import Judge
from pipeline.judge.client import JudgeUnavailable
from pipeline.judge.prompts import render_content, render_response
from pipeline.judge.teacher import Teacher
from pipeline.judge.votes import EvalResult, HintResult
from pipeline.rewards.protocols import RewardProcessor, close_processor, run_processor
from pipeline.rewards.types import reward_input_from_paired
from pipeline.scoring.mask import Mode
from pipeline.scoring.samples import build_sample

ScorerKind = Literal["judge", "rewards"]


class PairScorer(Protocol):
    """Scores one pair; the judging stage calls nothing else."""

    @property
    def identity(self) -> JudgeIdentity:
        """The judge recorded on every sample."""
        ...

    @property
    def kind(self) -> ScorerKind:
        """What scores: the length-bias metric's ``processor`` label."""
        ...

    async def score(self, paired: Paired) -> Sample:
        """The scored sample of ``paired``; raises JudgeUnavailable for transient trouble."""
        ...

    async def close(self) -> None:
        """Release the clients the scorer holds (once, when the stage stops)."""
        ...


@dataclass
class PrmScorer:
    """The PRM judge: eval and/or hint votes as the mode needs, the OPD teacher, the mask."""

    judge: Judge
    mode: Mode
    teacher: Teacher | None = None
    kind: ScorerKind = "judge"

    @property
    def identity(self) -> JudgeIdentity:
        return self.judge.identity

    async def score(self, paired: Paired) -> Sample:
        return await score_pair(paired, self.judge, self.mode, self.teacher)

    async def close(self) -> None:
        """The judge's client and the teacher's, once each (the teacher may share the judge's)."""
        judge: Any = getattr(self.judge, "client", None)
        teacher = self.teacher.client if self.teacher is not None else None
        for client in (judge, teacher if teacher is not judge else None):
            if client is not None:
                await client.close()


@dataclass
class ProcessorScorer:
    """Reward processors in place of the judge (list ``pipeline.rewards.prm:PrmJudge`` in the
    rewards file to keep it)."""

    processor: RewardProcessor
    identity: JudgeIdentity
    kind: ScorerKind = "rewards"

    async def score(self, paired: Paired) -> Sample:
        return await score_with_processor(paired, self.processor, self.identity)

    async def close(self) -> None:
        await close_processor(self.processor)


@dataclass
class ByGroup:
    """Grouped turns to ``groups`` (a group reward), the others to ``ungrouped``."""

    groups: PairScorer
    ungrouped: PairScorer
    kind: ScorerKind = "rewards"

    @property
    def identity(self) -> JudgeIdentity:
        return self.groups.identity

    async def score(self, paired: Paired) -> Sample:
        if paired.turn.group_id:
            return await self.groups.score(paired)
        return await self.ungrouped.score(paired)

    async def close(self) -> None:
        await self.groups.close()
        await self.ungrouped.close()


async def score_pair(
    paired: Paired, judge: Judge, mode: Mode, teacher: Teacher | None = None
) -> Sample:
    """Judge a pair (no call when it has no next state) and attach its loss mask.

    Raises JudgeUnavailable when the judge cannot be reached: the caller sends
    the pair to the retry topic; it never becomes a score.
    """
    turn, next_state = paired.turn, paired.next_state
    started = time.monotonic()
    ev: EvalResult | None = None
    hi: HintResult | None = None
    if next_state is not None:
        args = (
            render_response(turn.response.content, turn.response.tool_calls),
            next_state.role,
            render_content(next_state.content),
        )
        if mode == "combine":  # eval and hint votes at the same time
            ev, hi = await asyncio.gather(judge.eval(*args), judge.hint(*args))
        elif mode == "rl":
            ev = await judge.eval(*args)
        else:
            hi = await judge.hint(*args)
    judge_s = time.monotonic() - started
    teacher_out = None
    if hi is not None and hi.hint and teacher is not None:
        teacher_out = await teacher.logprobs(turn, hi.hint)
    return build_sample(paired, judge.identity, mode, ev, hi, judge_s, teacher_out)


def judge_calls_of(metrics: dict[str, float]) -> int:
    """Judge calls the processors report (their ``judge_calls`` metrics, summed)."""
    return int(sum(v for k, v in metrics.items() if k.split("/")[-1] == "judge_calls"))


async def score_with_processor(
    paired: Paired, processor: RewardProcessor, identity: JudgeIdentity
) -> Sample:
    """The sample of ``paired`` scored by ``processor``; raises JudgeUnavailable on FAILED."""
    if paired.next_state is None and not paired.rollout_final:
        return build_sample(paired, identity, "rl", None, None, 0.0)
    started = time.monotonic()
    out = await run_processor(processor, reward_input_from_paired(paired))
    judge_s = time.monotonic() - started
    if not out.ok:
        raise JudgeUnavailable(f"reward processor FAILED: {out.error}")
    metrics = dict(out.reward.reward_metrics) if out.reward else {}
    sample = build_sample(paired, identity, "rl", None, None, judge_s)
    return sample.model_copy(
        update={
            "score": out.score,
            "loss_mask": 1,
            "exclude_reason": None,
            "judge_calls": judge_calls_of(metrics),
            "reward_metrics": metrics,
        }
    )
