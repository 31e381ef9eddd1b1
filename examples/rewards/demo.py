"""The simplest reward: 1.0 when the ground truth appears in the last message, else 0.0.

The SDK guide's example, kept once, as the guide writes it, in
``examples/sdk/functions/reward/reward.py`` (``functions.reward.reward.DemoRewardProcessor``
from ``examples/sdk``); this module gives it its class path from the repository root.

    turnstream reward test --processor examples.rewards.demo:DemoRewardProcessor \\
        --input examples/rewards/reward_input.json
"""

from examples.sdk.functions.reward.reward import DemoRewardProcessor

__all__ = ["DemoRewardProcessor"]
