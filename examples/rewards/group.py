"""A group reward: several outputs of one prompt in, one reward per output out (same order).

Per output: 1.0 when the ground truth appears in one of its messages, 0.5 when
it has messages but not the ground truth, 0.0 when it has none (or there is
no ground truth). Nothing is normalised inside the group. The SDK guide's
example, kept once in ``examples/sdk/functions/reward/group_reward.py``; this
module gives it its class path from the repository root.

    turnstream reward test --processor examples.rewards.group:DemoGroupRewardProcessor \\
        --input examples/rewards/group_reward_input.json
"""

from examples.sdk.functions.reward.group_reward import DemoGroupRewardProcessor

__all__ = ["DemoGroupRewardProcessor"]
