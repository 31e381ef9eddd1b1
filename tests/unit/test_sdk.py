"""pipeline.sdk: the SDK guide's examples run with only their imports changed.

The examples are in examples/sdk/functions, loaded by the class paths the guide
registers them with, from that directory; the rollouts talk to the policy
simulator over HTTP.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import pipeline.rewards
import pipeline.rollouts
import pipeline.sdk
from pipeline.errors import RewardError, RolloutError
from pipeline.rewards import (
    AgentOutput,
    GroupRewardInput,
    RewardInput,
    TaskStatus,
    load_class,
    load_processor,
    run_group_processor,
    run_processor,
    setup_processor,
)
from pipeline.rollouts import RolloutInput, RolloutOutput, run_rollout_processor
from pipeline.testing.policy_sim import PolicySimulator
from tests.conftest import REPO
from tests.rollout_helpers import in_sdk, policy_simulator

__all__ = ["in_sdk", "policy_simulator"]  # fixtures

SDK = REPO / "examples" / "sdk"
REWARD_INPUTS = REPO / "examples" / "rewards"

ISSUE_NAMES = [
    "AbstractRolloutProcessor",
    "RolloutInput",
    "RolloutOutput",
    "AgentOutput",
    "AbstractRewardProcessor",
    "RewardInput",
    "RewardOutput",
    "Reward",
    "AbstractGroupRewardProcessor",
    "GroupRewardInput",
    "GroupRewardOutput",
    "GroupReward",
    "TaskStatus",
    "reward_func",
    "sub_reward_func",
    "aggregate_func",
    "observe_processor",
    "trace_client",
    "trace_tool",
]


def seed_task(**changes: Any) -> dict[str, Any]:
    data = json.loads((SDK / "resources" / "rollout_input.json").read_text())
    return {**data, **changes}


def task_on(base_url: str, content: str, **changes: Any) -> RolloutInput:
    resource = {"model_name": "qwen3.5-9b", "base_url": base_url, "api_key": "sk-test"}
    return RolloutInput.model_validate(
        seed_task(
            messages=[{"role": "user", "content": content}], model_resource=resource, **changes
        )
    )


def test_every_component_name_imports_from_pipeline_sdk() -> None:
    assert set(ISSUE_NAMES) <= set(pipeline.sdk.__all__)
    for name in pipeline.sdk.__all__:
        here = getattr(pipeline.sdk, name)
        # re-exported, not copied: one definition each, in rewards or rollouts
        home = pipeline.rewards if hasattr(pipeline.rewards, name) else pipeline.rollouts
        assert getattr(home, name) is here, name


def test_the_guides_rollout_input_parses_and_keeps_unknown_fields() -> None:
    task = RolloutInput.model_validate(seed_task())
    assert task.messages == [{"role": "user", "content": "Hello, please introduce yourself"}]
    assert task.tools is None and task.ground_truth == ""
    assert task.rollout_extra == {
        "rollout_id": "ro-ins-e8e92e94-b5c3-4546-b7b1-9832b8b948f2",
        "training_state": {"task_id": "task-001"},
        "additional_field": "any extra data you want",
    }
    params = task.sampling_params
    assert (params.max_turns, params.timeout, params.temperature) == (25, 60.0, 0.7)
    assert params.request_fields() == ({"temperature": 0.7, "max_tokens": 1024}, {})
    assert task.model_resource.model_name == "qwen3.5-9b"
    assert task.model_resource.base_url == "https://dashscope.aliyuncs.com/compatible-mode/v1"
    assert task.model_resource.api_key == "your-api-key-here"
    assert "your-api-key-here" not in repr(task)
    assert task.request_metadata is not None
    assert task.request_metadata["attempt_id"] == "dummy-attempt-id"


def test_sampling_fields_beyond_openais_go_to_the_extra_body() -> None:
    task = RolloutInput.model_validate(
        seed_task(sampling_params={"temperature": 0.2, "top_k": 20, "repetition_penalty": 1.1})
    )
    assert task.sampling_params.max_turns == 25  # the bounds' defaults
    assert task.sampling_params.request_fields() == (
        {"temperature": 0.2},
        {"top_k": 20, "repetition_penalty": 1.1},
    )


def test_unknown_fields_and_rollout_extra_must_agree_and_nulls_are_empty() -> None:
    same = RolloutInput.model_validate({"rollout_extra": {"k": 1}, "k": 1, "messages": None})
    assert same.rollout_extra == {"k": 1} and same.messages == []
    with pytest.raises(ValidationError, match="k given both at the top level and in rollout_extra"):
        RolloutInput.model_validate({"rollout_extra": {"k": 1}, "k": 2})
    with pytest.raises(ValidationError, match=r"model_resource\.colour"):
        RolloutInput.model_validate({"model_resource": {"colour": "red"}})


def test_a_rollout_output_has_a_status_and_a_failed_one_says_why() -> None:
    with pytest.raises(ValidationError, match="status"):
        RolloutOutput.model_validate({"agent_output": {"messages": []}})
    with pytest.raises(ValidationError, match="a FAILED output must set error"):
        RolloutOutput(status=TaskStatus.FAILED)
    failed = RolloutOutput(status=TaskStatus.FAILED, error="LLM 调用超时")
    assert not failed.ok and failed.agent_output.messages == []


async def test_the_guides_basic_rollout_returns_the_task_messages(in_sdk: Path) -> None:
    processor = load_processor("functions.rollout.my_rollout.MyRolloutProcessor")
    setup_processor(processor)
    task = RolloutInput.model_validate(seed_task())
    out = await run_rollout_processor(processor, task)
    assert out.status is TaskStatus.SUCCESS and out.error is None
    assert out.agent_output.messages == task.messages
    assert out.agent_output.rollout_metrics == {"latency": 1.2}


@pytest.mark.parametrize(
    ("prompt", "tool", "result", "error"),
    [
        ("search trains to Porto", "search", "3 results for 'search trains to Porto'", None),
        ("weather in Lisbon", "weather", "sunny, 21 C", None),
        ("stock_price of ACME", "stock_price", None, "ConnectionError: the quote service is down"),
    ],
)
async def test_the_demo_rollout_calls_each_kind_of_tool_through_the_policy(
    in_sdk: Path,
    policy_simulator: tuple[PolicySimulator, str],
    prompt: str,
    tool: str,
    result: str | None,
    error: str | None,
) -> None:
    sim, url = policy_simulator
    processor = load_processor("functions.rollout.rollout_only.DemoRolloutProcessor")
    task = task_on(url, prompt)
    out = await run_rollout_processor(processor, task)
    assert out.status is TaskStatus.SUCCESS, out.error
    messages = out.agent_output.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"]["name"] == tool
    assert messages[2]["content"] == (result if error is None else f"error: {error}")
    assert messages[3]["content"] == f"Here is my answer to: {prompt}"
    assert out.agent_output.rollout_metrics == {
        "model_calls": 2.0,
        "tool_errors": float(error is not None),
    }
    calls = task.trace.calls
    assert [type(c).__name__ for c in calls] == ["ModelCall", "ToolCall", "ModelCall"]
    assert [c.index for c in calls] == [0, 1, 2]
    first, used, second = task.trace.model_calls[0], calls[1], task.trace.model_calls[1]
    assert (used.name, used.arguments, used.result, used.error) == (
        tool,
        {"query": prompt},
        result,
        error,
    )
    assert first.messages == messages[:1] and first.response == messages[1]
    assert second.messages == messages[:3] and second.response == messages[3]
    assert (first.finish_reason, second.finish_reason) == ("tool_calls", "stop")
    # the client was built from the task: its model and sampling fields reached the server
    for body in sim.requests:
        assert (body["model"], body["temperature"], body["max_tokens"]) == ("qwen3.5-9b", 0.7, 1024)
    assert first.params == {"temperature": 0.7, "max_tokens": 1024}


async def test_the_demo_rollout_fails_when_the_policy_cannot_be_reached(
    in_sdk: Path, policy_simulator: tuple[PolicySimulator, str]
) -> None:
    sim, url = policy_simulator
    sim.config.chat_fail_first = 100  # every try answers 500
    task = task_on(url, "search trains to Porto")
    out = await run_rollout_processor(
        load_processor("functions.rollout.rollout_only.DemoRolloutProcessor"), task
    )
    assert out.status is TaskStatus.FAILED and out.agent_output.messages == []
    assert out.error is not None and out.error.startswith("LLM call failed: ")
    assert "simulated policy server failure" in out.error
    assert sim.chat_calls == 3  # the first try and two retries
    assert task.trace.calls == []


async def test_the_guides_reward_examples_give_their_scores(
    in_sdk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.rewards.observe")
    demo = load_processor("functions.reward.reward.DemoRewardProcessor")
    assert isinstance(demo, pipeline.sdk.AbstractRewardProcessor)
    data = json.loads((REWARD_INPUTS / "reward_input.json").read_text())
    out = await run_processor(demo, RewardInput.model_validate(data))
    # "0.5" is not in the last message ("Test question"): 0.0, a SUCCESS all the same
    assert out.status is TaskStatus.SUCCESS and out.score == 0.0
    assert out.reward is not None and out.reward.reward_metrics == {"test1": 0.5, "test2": 0.3}
    observed = [r for r in caplog.records if r.name == "pipeline.rewards.observe"]
    assert [r.getMessage().split(" in ")[0] for r in observed] == [
        "DemoRewardProcessor.process: success"
    ]

    safety = load_processor("functions/reward/reward_decorator.py:SafetyProcessor")
    assert isinstance(safety, pipeline.sdk.AbstractRewardProcessor)
    data = json.loads((REWARD_INPUTS / "reward_decorator_input.json").read_text())
    out = await run_processor(safety, RewardInput.model_validate(data))
    assert out.score == pytest.approx(0.85)  # 1.0 * 0.7 + 0.5 * 0.3
    assert out.reward is not None and out.reward.reward_metrics["aggregate-1"] == 0.4

    group = load_processor("functions.reward.group_reward:DemoGroupRewardProcessor")
    data = json.loads((REWARD_INPUTS / "group_reward_input.json").read_text())
    both = GroupRewardInput.model_validate(
        {**data, "agent_outputs": [*data["agent_outputs"], {"messages": []}]}
    )
    result = await run_group_processor(group, both)
    assert result.reward is not None
    # messages without the ground truth: 0.5; no messages: 0.0
    assert [r.reward_score for r in result.reward.rewards] == [0.5, 0.0]


@pytest.mark.parametrize(
    ("classpath", "name"),
    [
        ("functions.reward.reward.DemoRewardProcessor", "DemoRewardProcessor"),
        ("functions.rollout.rollout_only.DemoRolloutProcessor", "DemoRolloutProcessor"),
        ("functions/reward/reward_decorator.py:SafetyProcessor", "SafetyProcessor"),
        ("functions.reward.group_reward:DemoGroupRewardProcessor", "DemoGroupRewardProcessor"),
    ],
)
def test_class_paths_load_in_the_guides_three_forms(
    in_sdk: Path, classpath: str, name: str
) -> None:
    assert load_class(classpath).__name__ == name


@pytest.mark.parametrize(
    ("classpath", "message"),
    [
        (
            "functions.reward.nope.DemoRewardProcessor",
            "no module named 'functions.reward.nope' "
            "(for 'functions.reward.nope.DemoRewardProcessor')",
        ),
        (
            "functions.reward.reward.Nope",
            "'functions.reward.reward.Nope': 'functions.reward.reward' has no attribute 'Nope' "
            "(the classes it defines: DemoRewardProcessor)",
        ),
        ("functions.reward.reward", "'functions.reward.reward' is not a class path: it names a"),
        ("functions/reward/reward_decorator.py", "a file path names its class after a colon"),
        ("functions/reward/missing.py:X", f"no such file (looked for {SDK}/functions/reward/"),
        ("DemoRewardProcessor", "'DemoRewardProcessor' is not a class path"),
    ],
)
def test_a_bad_class_path_says_which_and_what_failed(
    in_sdk: Path, classpath: str, message: str
) -> None:
    with pytest.raises(RewardError) as caught:
        load_class(classpath, where="rollout: ")
    assert str(caught.value).startswith("rollout: ")
    assert message in str(caught.value)


def test_the_base_classes_still_demand_a_process() -> None:
    class NoProcess(pipeline.sdk.AbstractRolloutProcessor):
        pass

    with pytest.raises(TypeError, match=r"abstract method '?process"):
        NoProcess()  # type: ignore[abstract]


async def test_a_rollout_processor_must_return_a_rollout_output() -> None:
    class Sloppy(pipeline.sdk.AbstractRolloutProcessor):
        def process(self, input: RolloutInput) -> Any:
            return AgentOutput()

    with pytest.raises(RolloutError, match=r"Sloppy\.process returned AgentOutput"):
        await run_rollout_processor(Sloppy(), RolloutInput())
