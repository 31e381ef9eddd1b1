from pipeline.sdk import (
    AbstractRewardProcessor,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    observe_processor,
)


class DemoRewardProcessor(AbstractRewardProcessor):
    def setup(self) -> None:
        pass

    @observe_processor
    async def process(self, input: RewardInput) -> RewardOutput:
        content = input.agent_output.messages[-1].get("content", "")
        ground_truth = input.ground_truth

        # 评分逻辑：检查答案是否正确
        score = 1.0 if ground_truth in content else 0.0

        return RewardOutput(
            reward=Reward(
                reward_score=score,
                reward_metrics={"test1": 0.5, "test2": 0.3},  # 自定义指标
            ),
            status=TaskStatus.SUCCESS,
            error=None,
        )
