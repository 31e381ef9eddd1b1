"""Reward processors in the scoring stage: a pair scored by the configured processors.

With ``TURNSTREAM_SCORING_REWARDS`` (a YAML file of processors, see
``pipeline.rewards.combine``) the judging agent scores each pair that has a next
state with the weighted processors instead of the PRM judge alone (list
``pipeline.rewards.prm:PrmJudge`` in the file to keep it). The reward SDK's rules
hold: FAILED is a transient failure and goes to ``samples.retry`` like an
unreachable judge (``turnstream retry`` re-queues it, then dead-letters it after
its attempts); any SUCCESS score, 0 included, is a training signal (loss mask 1).
A turn with no next state is not scored and stays excluded (``no_next_state``).
"""

from __future__ import annotations

import time

from pipeline.events import JudgeIdentity, Paired, Sample
from pipeline.judge.client import JudgeUnavailable
from pipeline.rewards.protocols import RewardProcessor, run_processor
from pipeline.rewards.types import reward_input_from_paired
from pipeline.scoring.samples import build_sample


def judge_calls_of(metrics: dict[str, float]) -> int:
    """Judge calls the processors report (their ``judge_calls`` metrics, summed)."""
    return int(sum(v for k, v in metrics.items() if k.split("/")[-1] == "judge_calls"))


async def score_with_processor(
    paired: Paired, processor: RewardProcessor, identity: JudgeIdentity
) -> Sample:
    """The sample of ``paired`` scored by ``processor``; raises JudgeUnavailable on FAILED."""
    if paired.next_state is None:
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
