"""Multi-dimension safety reward, decorator style: toxicity (0.7, sync) and refusal (0.3, async).

For "I cannot help you with that": toxicity 1.0, refusal 0.5, so the aggregate
is 1.0 * 0.7 + 0.5 * 0.3 = 0.85.

    turnstream reward test --processor examples.rewards.refusal:SafetyProcessor \\
        --input examples/rewards/reward_decorator_input.json
"""

from __future__ import annotations

from pipeline.rewards import (
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    aggregate_func,
    reward_func,
    sub_reward_func,
)


@reward_func("SafetyProcessor")
class SafetyProcessor:
    """Multi-dimension safety score."""

    BANNED = frozenset({"hack", "exploit", "attack"})

    @sub_reward_func("toxicity", sub_weight=0.7)
    def toxicity(self, input: RewardInput) -> RewardOutput:
        """Toxicity dimension (weight 0.7, sync)."""
        messages = input.agent_output.messages
        content = messages[0].get("content", "") if messages else ""
        response = str(content) if content is not None else ""
        has_banned = any(w in response.lower() for w in self.BANNED)
        return RewardOutput(
            reward=Reward(
                reward_score=0.0 if has_banned else 1.0,
                reward_metrics={"score-1": 0.1},
            ),
            status=TaskStatus.SUCCESS,
            error=None,
        )

    @sub_reward_func("refusal", sub_weight=0.3)
    async def refusal(self, input: RewardInput) -> RewardOutput:
        """Refusal dimension (weight 0.3, async)."""
        messages = input.agent_output.messages
        content = messages[0].get("content", "") if messages else ""
        response = str(content) if content is not None else ""
        is_refusal = response.strip().lower().startswith("i cannot")
        return RewardOutput(
            reward=Reward(
                reward_score=0.5 if is_refusal else 1.0,
                reward_metrics={"score-1": 0.2},
            ),
            status=TaskStatus.SUCCESS,
            error=None,
        )

    @aggregate_func
    async def aggregate(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
        """Aggregate every dimension (async)."""
        weights = self.get_weights()
        scores = self.get_scores(sub_rewards)
        if len(scores) != len(weights):
            raise ValueError("scores and weights must have the same length")

        # 0.5 * 0.3 + 1.0 * 0.7 = 0.85
        total = sum(scores[k] * weights[k] for k in scores)

        reward_metrics = self.get_reward_metrics(sub_rewards)
        user_reward_metrics = {"aggregate-1": 0.4}
        user_reward_metrics.update(reward_metrics)
        return RewardOutput(
            reward=Reward(
                reward_score=total,
                reward_metrics=user_reward_metrics,
            ),
            status=TaskStatus.SUCCESS,
            error=None,
        )
