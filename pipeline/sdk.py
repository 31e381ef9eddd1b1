"""One import place for every function component: rollout, reward and group reward.

Code written against the reward and rollout SDK guide runs with its imports
changed to ``from pipeline.sdk import ...``; the names are those of the guide.
The definitions live in ``pipeline.rollouts`` and ``pipeline.rewards``.
"""

from pipeline.rewards.decorators import aggregate_func, reward_func, sub_reward_func
from pipeline.rewards.observe import observe_processor
from pipeline.rewards.protocols import AbstractGroupRewardProcessor, AbstractRewardProcessor
from pipeline.rewards.types import (
    AgentOutput,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
)
from pipeline.rollouts.client import trace_client
from pipeline.rollouts.protocols import AbstractRolloutProcessor
from pipeline.rollouts.trace import ModelCall, RolloutTrace, ToolCall, trace_tool
from pipeline.rollouts.types import ModelResource, RolloutInput, RolloutOutput, SamplingParams

__all__ = [
    "AbstractGroupRewardProcessor",
    "AbstractRewardProcessor",
    "AbstractRolloutProcessor",
    "AgentOutput",
    "GroupReward",
    "GroupRewardInput",
    "GroupRewardOutput",
    "ModelCall",
    "ModelResource",
    "Reward",
    "RewardInput",
    "RewardOutput",
    "RolloutInput",
    "RolloutOutput",
    "RolloutTrace",
    "SamplingParams",
    "TaskStatus",
    "ToolCall",
    "aggregate_func",
    "observe_processor",
    "reward_func",
    "sub_reward_func",
    "trace_client",
    "trace_tool",
]
