from pipeline.sdk import (
    AbstractRolloutProcessor,
    AgentOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
)


class MyRolloutProcessor(AbstractRolloutProcessor):
    def setup(self) -> None:
        """初始化资源（服务启动时执行一次）"""
        # 初始化 LLM 客户端、加载工具等
        pass

    async def process(self, input: RolloutInput) -> RolloutOutput:
        """生成 Agent 轨迹（每个样本调用一次）"""
        messages = input.messages or []
        model = input.model_resource.model_name
        # ... 与 LLM 交互、调用工具
        return RolloutOutput(
            agent_output=AgentOutput(
                messages=messages,
                rollout_metrics={"latency": 1.2},  # 自定义指标
            ),
            status=TaskStatus.SUCCESS,
        )
