"""The simplest reward: 1.0 when the ground truth appears in the last message, else 0.0.

    turnstream reward test --processor examples.rewards.demo:DemoRewardProcessor \\
        --input examples/rewards/reward_input.json
"""

from __future__ import annotations

from pipeline.rewards import Reward, RewardInput, RewardOutput, TaskStatus


class DemoRewardProcessor:
    def setup(self) -> None:
        pass

    async def process(self, input: RewardInput) -> RewardOutput:
        content = input.agent_output.messages[-1].get("content", "")
        ground_truth = input.ground_truth

        # Scoring: is the answer right?
        score = 1.0 if ground_truth in content else 0.0

        return RewardOutput(
            reward=Reward(
                reward_score=score,
                reward_metrics={"test1": 0.5, "test2": 0.3},  # custom metrics
            ),
            status=TaskStatus.SUCCESS,
            error=None,
        )
