"""The judging stage of a settings object: what the scoring worker and ``turnstream rescore``
both judge with (the PRM judge, or the reward processors of TURNSTREAM_SCORING_REWARDS)."""

from __future__ import annotations

import logging

from pipeline.errors import ConfigError
from pipeline.judge.asking import Judge
from pipeline.judge.factory import build_judge
from pipeline.judge.teacher import Teacher
from pipeline.rewards.combine import RewardPlan, load_plan
from pipeline.scoring.groups import GroupScorer
from pipeline.scoring.mask import Mode
from pipeline.scoring.scorers import ByGroup, PairScorer, PrmScorer, ProcessorScorer
from pipeline.scoring.stages import JudgeStage
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def build_stage(settings: Settings) -> JudgeStage:
    """The judging stage these settings describe, its judge and rewards set up."""
    judge, teacher = build_judge(settings)
    plan = load_rewards(settings)
    return JudgeStage(settings.topics, scorer_of(judge, settings.scoring.mode, teacher, plan))


def scorer_of(
    judge: Judge, mode: Mode, teacher: Teacher | None, plan: RewardPlan | None
) -> PairScorer:
    """The PRM judge, or the plan's rewards: a group reward for grouped turns (all turns,
    when the plan has no per-turn processors), the processors for the others."""
    if plan is None:
        return PrmScorer(judge, mode, teacher)
    per_turn = ProcessorScorer(plan.processor, judge.identity) if plan.processor else None
    groups = GroupScorer.of(plan.group, judge.identity) if plan.group else None
    if groups is not None and per_turn is not None:
        return ByGroup(groups, per_turn)
    scorer = groups or per_turn
    if scorer is None:  # a rewards file names at least one reward
        raise ConfigError("a rewards plan with neither processors nor a group")
    return scorer


def load_rewards(settings: Settings) -> RewardPlan | None:
    """The rewards of ``TURNSTREAM_SCORING_REWARDS`` (a RewardPlan), set up; None when unset."""
    path = settings.scoring.rewards
    if path is None:
        return None
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
