"""Group rewards: scoring a group together, and group-relative advantages (no max-normalising)."""

from __future__ import annotations

import math

import pytest

from examples.rewards.group import DemoGroupRewardProcessor
from pipeline.errors import RewardError
from pipeline.rewards import (
    AgentOutput,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    TaskStatus,
    group_advantages,
    group_by,
    group_input,
    score_group,
)


def member(content: str, prompt_id: str = "p1", truth: str = "42") -> RewardInput:
    return RewardInput(
        agent_output=AgentOutput(messages=[{"role": "assistant", "content": content}]),
        ground_truth=truth,
        request_metadata={"prompt_id": prompt_id},
    )


def test_advantages_by_hand() -> None:
    scores = [1.0, 0.0, 0.5, 0.5]  # mean 0.5
    assert group_advantages(scores, "mean") == [0.5, -0.5, 0.0, 0.0]
    # leave-one-out: 1.0 - (0.0 + 0.5 + 0.5) / 3 = 2/3; 0.0 - (1.0 + 0.5 + 0.5) / 3 = -2/3
    assert group_advantages(scores, "leave_one_out") == pytest.approx([2 / 3, -2 / 3, 0.0, 0.0])
    # sample std: sqrt((0.25 + 0.25 + 0 + 0) / 3) = sqrt(1/6); 0.5 / sqrt(1/6) = 1.2247...
    std = math.sqrt(1 / 6)
    assert group_advantages(scores, "mean_std") == pytest.approx(
        [0.5 / std, -0.5 / std, 0.0, 0.0], rel=1e-5
    )


def test_advantages_are_not_divided_by_the_group_max() -> None:
    # a max-normalised group would give [0.5, -0.5] for both; the mean baseline keeps scale
    assert group_advantages([2.0, 0.0], "mean") == [1.0, -1.0]
    assert group_advantages([20.0, 0.0], "mean") == [10.0, -10.0]
    assert group_advantages([20.0, 0.0], "leave_one_out") == [20.0, -20.0]


@pytest.mark.parametrize("method", ["mean", "mean_std", "leave_one_out"])
def test_groups_without_signal_have_zero_advantage(method: str) -> None:
    assert group_advantages([1.0, 1.0, 1.0], method) == [0.0, 0.0, 0.0]  # type: ignore[arg-type]
    assert group_advantages([0.7], method) == [0.0]  # type: ignore[arg-type]
    assert group_advantages([], method) == []  # type: ignore[arg-type]


def test_bad_advantage_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown advantage method 'max'"):
        group_advantages([1.0, 0.0], "max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")], "mean")


def test_group_by_keeps_first_seen_order() -> None:
    items = [member("a", "p2"), member("b", "p1"), member("c", "p2")]
    groups = group_by(items, lambda m: (m.request_metadata or {})["prompt_id"])
    assert list(groups) == ["p2", "p1"]
    assert [m.agent_output.messages[0]["content"] for m in groups["p2"]] == ["a", "c"]


async def test_a_group_is_scored_together_one_output_per_member() -> None:
    members = [member("It is 42."), member("Maybe 41."), member("42, surely.")]
    outs = await score_group(DemoGroupRewardProcessor(), members, group_key="p1")
    assert [o.score for o in outs] == [1.0, 0.5, 1.0]
    assert all(o.status is TaskStatus.SUCCESS for o in outs)
    built = group_input(members, "p1")
    assert built.group_key == "p1" and built.ground_truth == "42"
    assert built.request_metadata == {"members": [{"prompt_id": "p1"}] * 3}


async def test_members_must_share_the_prompt_and_outputs_must_match_in_length() -> None:
    with pytest.raises(RewardError, match="disagree on ground_truth"):
        group_input([member("a", truth="1"), member("b", truth="2")], "p1")

    class Short:
        def setup(self) -> None:
            pass

        def process(self, input: GroupRewardInput) -> GroupRewardOutput:
            return GroupRewardOutput(
                reward=GroupReward(rewards=[Reward(reward_score=1.0)]), status=TaskStatus.SUCCESS
            )

    with pytest.raises(RewardError, match="returned 1 reward\\(s\\) for 2 output\\(s\\)"):
        await score_group(Short(), [member("a"), member("b")], "p1")


async def test_a_failed_group_fails_every_member() -> None:
    class Down:
        def setup(self) -> None:
            pass

        async def process(self, input: GroupRewardInput) -> GroupRewardOutput:
            return GroupRewardOutput(status=TaskStatus.FAILED, error="ranker timed out")

    outs = await score_group(Down(), [member("a"), member("b")], "p9")
    assert [o.status for o in outs] == [TaskStatus.FAILED, TaskStatus.FAILED]
    assert outs[0].error == "group 'p9': ranker timed out"
