"""Reward processors: pluggable rewards with a task status, weighted sub-rewards and groups.

A processor is any object with ``setup()`` and ``process(RewardInput) ->
RewardOutput`` (sync or async); ``AbstractRewardProcessor`` is the SDK guide's
optional base class, and ``observe_processor`` times, counts and logs each
call. ``reward_func`` / ``sub_reward_func`` / ``aggregate_func`` split one
reward into weighted dimensions; ``WeightedReward`` combines several
processors from a YAML file; ``HybridReward`` gates a model judge behind a
rule; ``PrmJudge`` is the scoring stage's judge as a processor. Group
processors score several outputs of one prompt together. The statistics
(length bias, pairwise consistency, agreement with a gold set) are pure
functions.
"""

from pipeline.rewards.combine import (
    ProcessorSpec,
    RewardPlan,
    RewardsConfig,
    WeightedProcessor,
    WeightedReward,
    build_weighted,
    load_plan,
    load_rewards_config,
    load_weighted,
)
from pipeline.rewards.decorators import aggregate_func, reward_func, sub_reward_func
from pipeline.rewards.group import group_advantages, group_by, group_input, score_group
from pipeline.rewards.grouping import GroupPlan, GroupSpec
from pipeline.rewards.hybrid import HybridReward
from pipeline.rewards.loading import load_class, load_processor
from pipeline.rewards.observe import observe_processor
from pipeline.rewards.protocols import (
    AbstractGroupRewardProcessor,
    AbstractRewardProcessor,
    GroupRewardProcessor,
    RewardProcessor,
    close_processor,
    processor_name,
    run_group_processor,
    run_processor,
    setup_processor,
)
from pipeline.rewards.quality import LengthBias, consistent_verdict, judge_pairwise, length_bias
from pipeline.rewards.stats import cohen_kappa, confusion_table, pearson, spearman_rho
from pipeline.rewards.types import (
    AgentOutput,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    response_text,
    reward_input_from_paired,
)

__all__ = [
    "AbstractGroupRewardProcessor",
    "AbstractRewardProcessor",
    "AgentOutput",
    "GroupPlan",
    "GroupReward",
    "GroupRewardInput",
    "GroupRewardOutput",
    "GroupRewardProcessor",
    "GroupSpec",
    "HybridReward",
    "LengthBias",
    "ProcessorSpec",
    "Reward",
    "RewardInput",
    "RewardOutput",
    "RewardPlan",
    "RewardProcessor",
    "RewardsConfig",
    "TaskStatus",
    "WeightedProcessor",
    "WeightedReward",
    "aggregate_func",
    "build_weighted",
    "close_processor",
    "cohen_kappa",
    "confusion_table",
    "consistent_verdict",
    "group_advantages",
    "group_by",
    "group_input",
    "judge_pairwise",
    "length_bias",
    "load_class",
    "load_plan",
    "load_processor",
    "load_rewards_config",
    "load_weighted",
    "observe_processor",
    "pearson",
    "processor_name",
    "response_text",
    "reward_func",
    "reward_input_from_paired",
    "run_group_processor",
    "run_processor",
    "score_group",
    "setup_processor",
    "spearman_rho",
    "sub_reward_func",
]
