"""A group reward: several outputs of one prompt in, one reward per output out (same order).

Per output: 1.0 when the ground truth appears in one of its messages, 0.5 when
it has messages but not the ground truth, 0.0 when it has none (or there is
no ground truth). Nothing is normalised inside the group.

    turnstream reward test --processor examples.rewards.group:DemoGroupRewardProcessor \\
        --input examples/rewards/group_reward_input.json
"""

from __future__ import annotations

from pipeline.rewards import GroupReward, GroupRewardInput, GroupRewardOutput, Reward, TaskStatus


class DemoGroupRewardProcessor:
    def setup(self) -> None:
        pass

    def process(self, input: GroupRewardInput) -> GroupRewardOutput:
        rewards = []
        for agent_output in input.agent_outputs:
            score = 0.0
            # ground_truth in a message's content -> 1.0; messages not empty -> 0.5; else 0.0
            if input.ground_truth is not None and agent_output.messages:
                gt_str = str(input.ground_truth)
                for msg in agent_output.messages:
                    if isinstance(msg.get("content"), str) and gt_str in msg["content"]:
                        score = 1.0
                        break
                if score == 0.0 and len(agent_output.messages) > 0:
                    score = 0.5
            rewards.append(Reward(reward_score=score))

        return GroupRewardOutput(
            reward=GroupReward(rewards=rewards),
            status=TaskStatus.SUCCESS,
            error=None,
        )
