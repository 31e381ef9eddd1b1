"""Multi-dimension safety reward, decorator style: toxicity (0.7, sync) and refusal (0.3, async).

For "I cannot help you with that": toxicity 1.0, refusal 0.5, so the aggregate
is 1.0 * 0.7 + 0.5 * 0.3 = 0.85. The SDK guide's example, kept once in
``examples/sdk/functions/reward/reward_decorator.py``; this module gives it its
class path from the repository root.

    turnstream reward test --processor examples.rewards.refusal:SafetyProcessor \\
        --input examples/rewards/reward_decorator_input.json
"""

from examples.sdk.functions.reward.reward_decorator import SafetyProcessor

__all__ = ["SafetyProcessor"]
