"""Whole rollouts for the reward processors: the task's ground truth on every turn, the last
turn scored on the rollout's messages without a next state, and a group of N rollouts
scored as N outputs whose every turn takes its rollout's score and group advantage."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.events import JudgeIdentity, Paired, SessionEnd, Turn
from pipeline.rewards import (
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
)
from pipeline.rewards.types import response_text
from pipeline.scoring.groups import GroupScorer
from pipeline.scoring.pairing import SessionState, pair_step
from pipeline.scoring.scorers import ProcessorScorer
from pipeline.training.batch import sample_reward
from tests.unit.test_pairing import IDLE

IDENTITY = JudgeIdentity(backend="rules", prompt_version="v1")


def turn(session: str, index: int, last: str, role: str = "user") -> Turn:
    call = {"tool_call_id": f"c{index}"} if role == "tool" else {}
    return Turn.model_validate(
        {"type": "turn", "session_id": session, "turn_index": index, "turn_type": "main",
         "messages": [{"role": role, "content": last, **call}],
         "response": {"content": f"{session} says {index}"}, "ts": 100.0 + index,
         "rollout": True, "group_id": "rollout:t", "group_size": 2}
    )  # fmt: skip


def rollout(session: str, answer: str, truth: Any = "4", reason: str = "client") -> list[Paired]:
    """Two turns (a tool call, then the answer) and the session's end, through the pairing."""
    said = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}]
    end = SessionEnd(
        type="session_end", session_id=session, ts=1e5, reason=reason,  # type: ignore[arg-type]
        ground_truth=truth, agent_messages=said,
    )  # fmt: skip
    state: SessionState | None = None
    pairs: list[Paired] = []
    for i, event in enumerate([turn(session, 0, "2+2?"), turn(session, 1, "4", "tool"), end]):
        stored = SessionState.from_dict(state.to_dict()) if state else None
        step = pair_step(stored, event, 1000.0 + i, IDLE)
        state, pairs = step.state, pairs + step.pairs
    return pairs


def test_a_successful_end_puts_the_ground_truth_on_each_turn_and_marks_the_last() -> None:
    first, last = rollout("r0", "it is 4")
    assert first.turn.ground_truth == "4" and last.turn.ground_truth == "4"
    assert (first.rollout_final, last.rollout_final) == (False, True)
    assert first.next_state is not None and last.next_state is None
    assert last.rollout_messages == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "it is 4"},
    ]
    assert first.rollout_messages is None
    failed = rollout("r1", "5", reason="rollout_failed")
    assert all(p.exclude_reason == "rollout_failed" for p in failed)
    assert all(p.turn.ground_truth is None and not p.rollout_final for p in failed)


class Contains:
    """1.0 when the judged output holds the ground truth; records what it was given."""

    def __init__(self) -> None:
        self.seen: list[RewardInput] = []

    def setup(self) -> None: ...

    def process(self, input: RewardInput) -> RewardOutput:
        self.seen.append(input)
        return RewardOutput.success(float(str(input.ground_truth) in response_text(input)))


def test_the_last_turn_is_scored_on_the_whole_rollout_with_no_next_state() -> None:
    first, last = rollout("r0", "it is 4")
    proc = Contains()
    scorer = ProcessorScorer(proc, IDENTITY)
    final = asyncio.run(scorer.score(last))
    assert (final.score, final.loss_mask, final.exclude_reason) == (1.0, 1, None)
    [given] = proc.seen
    assert given.next_state is None and given.ground_truth == "4" and given.response is None
    assert given.agent_output.messages[-1] == {"role": "assistant", "content": "it is 4"}
    assert given.request_metadata is not None and given.request_metadata["rollout_final"]
    tool_turn = asyncio.run(scorer.score(first))  # judged per turn, on its tool next state
    assert proc.seen[-1].next_state is not None and proc.seen[-1].ground_truth == "4"
    assert tool_turn.score == 0.0 and tool_turn.loss_mask == 1  # "r0 says 0" lacks "4"
    plain = last.model_copy(update={"rollout_final": False})
    assert asyncio.run(scorer.score(plain)).exclude_reason == "no_next_state"


class Exact:
    """A group reward: 1.0 for an output whose last message holds the ground truth."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def setup(self) -> None: ...

    def process(self, input: GroupRewardInput) -> GroupRewardOutput:
        last = [str(o.messages[-1]["content"]) for o in input.agent_outputs]
        self.calls.append(last)
        rewards = [Reward(reward_score=float(str(input.ground_truth) in m)) for m in last]
        return GroupRewardOutput(reward=GroupReward(rewards=rewards), status=TaskStatus.SUCCESS)


def test_a_group_of_rollouts_waits_for_each_rollouts_end_and_scores_rollouts() -> None:
    proc = Exact()
    scorer = GroupScorer(proc, IDENTITY, name="exact", timeout_s=30)
    pairs = rollout("r0", "it is 4") + rollout("r1", "it is 5")

    async def score() -> list[Any]:
        early = [asyncio.ensure_future(scorer.score(p)) for p in pairs[:3]]
        await asyncio.sleep(0.05)
        # three turns of a group of size 2 are here, but only one rollout has ended
        assert not any(f.done() for f in early) and proc.calls == []
        return await asyncio.gather(*early, scorer.score(pairs[3]))

    samples = asyncio.run(score())
    assert proc.calls == [["it is 4", "it is 5"]]  # once, one output a rollout
    assert [(s.session_id, s.score, s.group_index) for s in samples] == [
        ("r0", 1.0, 0),
        ("r0", 1.0, 0),
        ("r1", 0.0, 1),
        ("r1", 0.0, 1),
    ]
    assert all(s.group_scores == [1.0, 0.0] and s.loss_mask == 1 for s in samples)
    assert samples[0].reward_metrics["exact/members"] == 2 and scorer.stats.complete == 1
    # the trainer's group advantage: each turn gets its rollout's score less the group's mean
    assert [sample_reward(s, "mean") for s in samples] == pytest.approx([0.5, 0.5, -0.5, -0.5])
