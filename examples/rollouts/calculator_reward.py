"""The calculator task's reward: 1.0 when the final answer holds the ground truth, else 0.0.

It reads the rollout's whole trajectory, ``RewardInput.agent_output.messages``,
and ``ground_truth``. The final answer is the last assistant message; one that
is still a tool call (a rollout cut short at ``max_turns``) is no answer and
scores 0.0, so that writing a call is never rewarded as answering. The rule is
the rollout's ``correct`` metric's: the ground truth as a whole word,
case-insensitive. A wrong answer, or no ground truth, is a SUCCESS with 0.0.

    turnstream reward test --processor examples.rollouts.calculator_reward:CalculatorReward \\
        --input reward_input.json
"""

from __future__ import annotations

from examples.rollouts.calculator import answers_of, final_answer, is_right
from pipeline.sdk import AbstractRewardProcessor, RewardInput, RewardOutput


class CalculatorReward(AbstractRewardProcessor):
    def setup(self) -> None:
        pass

    def process(self, input: RewardInput) -> RewardOutput:
        messages = input.agent_output.messages
        score = float(is_right(messages, input.ground_truth))
        return RewardOutput.success(
            score,
            {
                "correct": score,
                "answered": float(final_answer(messages) is not None),
                "has_ground_truth": float(any(a.strip() for a in answers_of(input.ground_truth))),
            },
        )
