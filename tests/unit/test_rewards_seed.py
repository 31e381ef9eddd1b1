"""The reward SDK guide's examples, reproduced: they must give the scores the guide states."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from examples.rewards.demo import DemoRewardProcessor
from examples.rewards.group import DemoGroupRewardProcessor
from examples.rewards.refusal import SafetyProcessor
from pipeline.rewards import (
    AgentOutput,
    GroupRewardInput,
    RewardInput,
    TaskStatus,
    processor_name,
    run_group_processor,
    run_processor,
    setup_processor,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rewards"


def said(content: str) -> RewardInput:
    return RewardInput(agent_output=AgentOutput(messages=[{"role": "user", "content": content}]))


async def test_decorator_example_gives_0_85_on_the_refusal_input() -> None:
    data = json.loads((EXAMPLES / "reward_decorator_input.json").read_text())
    processor = SafetyProcessor()
    setup_processor(processor)
    out = await run_processor(processor, RewardInput.model_validate(data))
    assert out.status is TaskStatus.SUCCESS and out.error is None
    # toxicity: no banned word -> 1.0 (weight 0.7); refusal: starts with "i cannot" -> 0.5
    # (weight 0.3); aggregate 1.0 * 0.7 + 0.5 * 0.3 = 0.85
    assert out.score == pytest.approx(0.85)
    assert out.reward is not None
    assert out.reward.reward_metrics == {
        "aggregate-1": 0.4,
        "toxicity": 1.0,
        "toxicity/score-1": 0.1,
        "refusal": 0.5,
        "refusal/score-1": 0.2,
    }
    assert processor_name(processor) == "SafetyProcessor"
    assert processor.get_weights() == {"toxicity": 0.7, "refusal": 0.3}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("Sure, here is the summary.", 1.0),  # 1.0 * 0.7 + 1.0 * 0.3
        ("I cannot help you with that", 0.85),  # 1.0 * 0.7 + 0.5 * 0.3
        ("Here is how to hack the router.", 0.3),  # 0.0 * 0.7 + 1.0 * 0.3
        ("I cannot explain that exploit.", 0.15),  # 0.0 * 0.7 + 0.5 * 0.3
    ],
)
async def test_decorator_example_weighs_each_branch(content: str, expected: float) -> None:
    out = await run_processor(SafetyProcessor(), said(content))
    assert out.score == pytest.approx(expected)


async def test_basic_example_scores_ground_truth_in_the_last_message() -> None:
    data = json.loads((EXAMPLES / "reward_input.json").read_text())
    seed_input = RewardInput.model_validate(data)
    assert seed_input.agent_output.rollout_metrics == {"accuracy": 0.95}
    out = await run_processor(DemoRewardProcessor(), seed_input)
    # "0.5" is not in the last message ("Test question"): 0.0, a SUCCESS all the same
    assert out.status is TaskStatus.SUCCESS and out.score == 0.0
    assert out.reward is not None and out.reward.reward_metrics == {"test1": 0.5, "test2": 0.3}
    hit = seed_input.model_copy(
        update={"agent_output": AgentOutput(messages=[{"role": "user", "content": "it is 0.5"}])}
    )
    assert (await run_processor(DemoRewardProcessor(), hit)).score == 1.0


async def test_group_example_gives_its_stated_scores() -> None:
    data = json.loads((EXAMPLES / "group_reward_input.json").read_text())
    out = await run_group_processor(
        DemoGroupRewardProcessor(), GroupRewardInput.model_validate(data)
    )
    assert out.status is TaskStatus.SUCCESS and out.reward is not None
    # messages not empty but without the ground truth "0.5" -> 0.5
    assert [r.reward_score for r in out.reward.rewards] == [0.5]

    group = GroupRewardInput(
        ground_truth="42",
        agent_outputs=[
            AgentOutput(messages=[{"role": "assistant", "content": "The answer is 42."}]),
            AgentOutput(messages=[{"role": "assistant", "content": "I think it is 41."}]),
            AgentOutput(messages=[]),
            AgentOutput(
                messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
            ),
        ],
    )
    out = await run_group_processor(DemoGroupRewardProcessor(), group)
    assert out.reward is not None
    # contains "42" -> 1.0; messages without it -> 0.5; no messages -> 0.0; any message counts
    assert [r.reward_score for r in out.reward.rewards] == [1.0, 0.5, 0.0, 1.0]

    no_truth = group.model_copy(update={"ground_truth": None})
    out = await run_group_processor(DemoGroupRewardProcessor(), no_truth)
    assert out.reward is not None
    assert [r.reward_score for r in out.reward.rewards] == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("cls", "guide_file"),
    [
        (DemoRewardProcessor, "reward.py"),
        (DemoGroupRewardProcessor, "group_reward.py"),
        (SafetyProcessor, "reward_decorator.py"),
    ],
)
def test_the_examples_are_the_guides_own_code_kept_once(cls: type, guide_file: str) -> None:
    # examples/rewards gives class paths from the repository root to the classes of
    # examples/sdk/functions/reward (the guide's class paths, from examples/sdk)
    source = Path(inspect.getsourcefile(cls) or "")
    assert source == EXAMPLES.parent / "sdk" / "functions" / "reward" / guide_file
