"""Group rewards in the scoring stage, and group-relative advantages in the trainer."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.errors import ConfigError, EventDecodeError
from pipeline.events import (
    JudgeIdentity,
    NextState,
    Paired,
    Response,
    RetryRecord,
    Sample,
    Turn,
    decode_as,
    decode_input,
    encode,
)
from pipeline.judge.client import JudgeUnavailable
from pipeline.rewards import (
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    group_advantages,
    load_plan,
    load_weighted,
)
from pipeline.scoring.build import load_rewards
from pipeline.scoring.groups import GroupScorer
from pipeline.scoring.retry import RetryReport, _route
from pipeline.scoring.scorers import ByGroup, ProcessorScorer
from pipeline.scoring.stages import JudgeStage, PairingStage
from pipeline.settings import Settings
from pipeline.training.batch import sample_reward, tokenize_sample
from pipeline.training.config import TrainerConfig

IDENTITY = JudgeIdentity(backend="rules", prompt_version="v1")
SETTINGS = Settings()
REPO = Path(__file__).resolve().parents[2]


def turn(
    session: str,
    answer: str,
    group: str | None = "q1",
    size: int | None = 3,
    truth: Any = "42",
) -> Turn:
    return Turn(
        type="turn",
        session_id=session,
        ts=1.0,
        turn_index=0,
        turn_type="main",
        messages=[{"role": "user", "content": "what is 6 x 7?"}],
        response=Response(content=answer),
        group_id=group,
        group_size=size,
        ground_truth=truth,
    )


def paired(t: Turn, next_state: bool = True, attempt: int = 1) -> Paired:
    return Paired(
        sample_id=t.sample_id,
        turn=t,
        next_state=NextState(role="user", content="ok") if next_state else None,
        first_judged=True,
        paired_ts=1.0,
        attempt=attempt,
    )


class Exact:
    """1 for an output whose last message holds the ground truth, else 0; counts calls."""

    def __init__(self, status: TaskStatus = TaskStatus.SUCCESS) -> None:
        self.status = status
        self.calls: list[int] = []

    def setup(self) -> None: ...

    async def process(self, input: GroupRewardInput) -> GroupRewardOutput:
        self.calls.append(len(input.agent_outputs))
        if self.status is TaskStatus.FAILED:
            return GroupRewardOutput(status=TaskStatus.FAILED, error="verifier down")
        rewards = [
            Reward(
                reward_score=float(str(input.ground_truth) in str(o.messages[-1]["content"])),
                reward_metrics={"chars": float(len(str(o.messages[-1]["content"])))},
            )
            for o in input.agent_outputs
        ]
        return GroupRewardOutput(reward=GroupReward(rewards=rewards), status=TaskStatus.SUCCESS)


async def score_all(scorer: GroupScorer, pairs: list[Paired]) -> list[Any]:
    return await asyncio.gather(*(scorer.score(p) for p in pairs), return_exceptions=True)


def test_members_are_scored_once_together_and_carry_the_group_scores() -> None:
    proc = Exact()
    scorer = GroupScorer(proc, IDENTITY, name="exact", timeout_s=5)
    pairs = [paired(turn(f"s{i}", a)) for i, a in enumerate(["42", "41", "it is 42"])]
    samples = asyncio.run(score_all(scorer, pairs))
    assert proc.calls == [3]  # one call, all three outputs
    assert [s.score for s in samples] == [1.0, 0.0, 1.0]
    for i, s in enumerate(samples):
        assert s.group_id == "q1" and s.group_scores == [1.0, 0.0, 1.0] and s.group_index == i
        assert s.loss_mask == 1 and s.exclude_reason is None
        assert s.reward_metrics["exact/members"] == 3 and s.reward_metrics["exact/complete"] == 1
        assert s.reward_metrics["exact"] == s.score and "exact/chars" in s.reward_metrics
    assert scorer.stats.complete == 1 and scorer.waiting == 0


def test_a_group_missing_members_is_scored_with_those_present_at_its_timeout() -> None:
    proc = Exact()
    scorer = GroupScorer(proc, IDENTITY, name="exact", timeout_s=0.05)
    pairs = [paired(turn("s0", "42", size=4)), paired(turn("s1", "x", size=4))]
    samples = asyncio.run(score_all(scorer, pairs))
    assert proc.calls == [2] and scorer.stats.timed_out == 1
    assert [s.group_scores for s in samples] == [[1.0, 0.0]] * 2
    assert all(s.reward_metrics["exact/complete"] == 0 for s in samples)


def test_the_size_of_the_rewards_file_applies_when_a_turn_gives_none() -> None:
    proc = Exact()
    scorer = GroupScorer(proc, IDENTITY, size=2, timeout_s=60)
    pairs = [paired(turn("s0", "42", size=None)), paired(turn("s1", "1", size=None))]
    samples = asyncio.run(asyncio.wait_for(score_all(scorer, pairs), 5))
    assert proc.calls == [2] and [s.score for s in samples] == [1.0, 0.0]


def test_a_member_read_twice_takes_one_place_in_its_group() -> None:
    proc = Exact()
    scorer = GroupScorer(proc, IDENTITY, timeout_s=5)
    a, b = paired(turn("s0", "42", size=2)), paired(turn("s1", "0", size=2))
    samples = asyncio.run(score_all(scorer, [a, a, b]))  # a re-delivered before b arrived
    assert proc.calls == [2] and scorer.stats.rejoined == 1
    assert samples[0] == samples[1] and samples[0].group_scores == [1.0, 0.0]


def test_a_failed_group_fails_every_member_as_a_transient_error() -> None:
    scorer = GroupScorer(Exact(TaskStatus.FAILED), IDENTITY, timeout_s=5)
    pairs = [paired(turn(f"s{i}", "42", size=2)) for i in range(2)]
    results = asyncio.run(score_all(scorer, pairs))
    assert all(isinstance(r, JudgeUnavailable) and "verifier down" in str(r) for r in results)
    assert scorer.stats.failed == 1


def test_a_processor_that_breaks_its_contract_fails_the_members_without_hanging() -> None:
    class Short(Exact):
        async def process(self, input: GroupRewardInput) -> GroupRewardOutput:
            return GroupRewardOutput(
                reward=GroupReward(rewards=[Reward(reward_score=1.0)]), status=TaskStatus.SUCCESS
            )

    scorer = GroupScorer(Short(), IDENTITY, timeout_s=5)
    pairs = [paired(turn(f"s{i}", "42", size=2)) for i in range(2)]
    results = asyncio.run(asyncio.wait_for(score_all(scorer, pairs), 5))
    assert all("exactly one per output" in str(r) for r in results)


def test_groups_with_different_keys_do_not_mix() -> None:
    proc = Exact()
    scorer = GroupScorer(proc, IDENTITY, timeout_s=5)
    pairs = [
        paired(turn("a0", "42", group="qa", size=2, truth="42")),
        paired(turn("b0", "7", group="qb", size=2, truth="7")),
        paired(turn("b1", "8", group="qb", size=2, truth="7")),
        paired(turn("a1", "42", group="qa", size=2, truth="42")),
    ]
    samples = asyncio.run(score_all(scorer, pairs))
    assert sorted(proc.calls) == [2, 2]
    assert [s.group_scores for s in samples] == [[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]
    assert [s.group_index for s in samples] == [0, 0, 1, 1]


class Single:
    def __init__(self) -> None:
        self.calls = 0

    def setup(self) -> None: ...

    def process(self, input: RewardInput) -> RewardOutput:
        self.calls += 1
        return RewardOutput.success(0.5)


def test_the_judging_stage_sends_grouped_turns_to_the_group_and_others_to_the_processors() -> None:
    topics = SETTINGS.topics
    single, group = Single(), Exact()
    stage = JudgeStage(
        topics,
        ByGroup(GroupScorer(group, IDENTITY, timeout_s=5), ProcessorScorer(single, IDENTITY)),
    )
    grouped = [paired(turn(f"s{i}", "42", size=2)) for i in range(2)]
    alone = paired(turn("s9", "42", group=None, size=None))

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(
                stage.handle(encode(p), p.route_key, f"turns.paired/0/{i}")
                for i, p in enumerate([*grouped, alone])
            )
        )

    outs = asyncio.run(run())
    samples = [decode_as(Sample, o[0].value) for o in outs]
    assert group.calls == [2] and single.calls == 1
    assert [s.group_scores for s in samples] == [[1.0, 1.0], [1.0, 1.0], None]
    assert samples[2].score == 0.5
    assert [o[0].key for o in outs] == [b"s0", b"s1", b"s9"]  # samples stay keyed by session


def test_a_failed_group_member_is_retried_under_its_group_key() -> None:
    topics = SETTINGS.topics
    stage = JudgeStage(topics, GroupScorer(Exact(TaskStatus.FAILED), IDENTITY, timeout_s=5))
    p = paired(turn("s0", "42", size=1))
    outs = asyncio.run(stage.handle(encode(p), b"q1", "turns.paired/0/0"))
    assert [(o.topic, o.key) for o in outs] == [(topics.samples_retry.name, b"q1")]
    sent = SimpleNamespace(records=[])
    sent.send = lambda topic, key=None, value=b"": sent.records.append((topic, key, value))
    rec = SimpleNamespace(
        value=outs[0].value, key=b"q1", topic=topics.samples_retry.name, partition=0, offset=0
    )
    _route(rec, sent, SETTINGS, 3, RetryReport())
    topic, key, value = sent.records[0]
    assert topic == topics.turns_paired.name and key == b"q1"
    assert decode_as(Paired, value).attempt == 2
    assert decode_as(RetryRecord, outs[0].value).paired.turn.group_id == "q1"


def test_pairing_keys_paired_turns_by_group_so_members_meet_on_one_partition() -> None:
    stage = PairingStage(SETTINGS.topics, idle_timeout_s=60)
    state: dict[str, Any] = {}
    keys = []
    for session in ("s0", "s1"):
        for raw in (
            encode(turn(session, "42")),
            encode(
                decode_input(
                    b'{"type":"message","session_id":"%s","ts":2,'
                    b'"message":{"role":"user","content":"ok"}}' % session.encode()
                )
            ),
        ):
            result = stage.handle(raw, session.encode(), "chat.turns/0/0", state.get)
            if result.session_id is not None:
                state[result.session_id] = result.state
            keys += [o.key for o in result.outs if o.topic == SETTINGS.topics.turns_paired.name]
    assert keys == [b"q1", b"q1"]


def test_group_size_needs_a_group_id() -> None:
    raw = encode(turn("s0", "42", group=None, size=None)).replace(
        b'"group_size":null', b'"group_size":3'
    )
    with pytest.raises(EventDecodeError, match="group_size is set but group_id is not"):
        decode_input(raw)


def test_a_group_only_rewards_file_loads_for_the_worker_and_not_for_one_turn(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rewards.yaml"
    path.write_text(
        "group:\n  classpath: examples.rewards.group:DemoGroupRewardProcessor\n"
        "  size: 4\n  timeout_s: 2\n"
    )
    plan = load_plan(path)
    assert plan.processor is None and plan.group is not None
    assert (plan.group.name, plan.group.size, plan.group.timeout_s) == (
        "DemoGroupRewardProcessor",
        4,
        2.0,
    )
    with pytest.raises(ConfigError, match="names only a group reward"):
        load_weighted(path)
    scoring = SETTINGS.scoring.model_copy(update={"rewards": path, "window": 3})
    with pytest.raises(ConfigError, match="larger than TURNSTREAM_SCORING_WINDOW"):
        load_rewards(SETTINGS.model_copy(update={"scoring": scoring}))
    scoring = SETTINGS.scoring.model_copy(update={"rewards": path})
    assert load_rewards(SETTINGS.model_copy(update={"scoring": scoring})).group is not None
    path.write_text(
        "group:\n  classpath: examples.rewards.group:DemoGroupRewardProcessor\n  timeout_s: 0\n"
    )
    with pytest.raises(ConfigError, match=r"group\.timeout_s"):
        load_plan(path)


def test_the_shipped_group_processor_runs_in_the_stage() -> None:
    plan = load_plan(REPO / "examples" / "rewards" / "rewards-group.yaml")
    plan.setup()
    assert plan.group is not None
    scorer = GroupScorer.of(plan.group, IDENTITY)
    pairs = [paired(turn(f"s{i}", a, size=2, truth="42")) for i, a in enumerate(["42", "no"])]
    samples = asyncio.run(score_all(scorer, pairs))
    # the seed's rule: ground truth in a message -> 1.0, else messages present -> 0.5
    assert [s.score for s in samples] == [1.0, 0.5]


# ---- trainer: group-relative advantages --------------------------------------------------


def scored(index: int | None, scores: list[float] | None, score: float = 1.0) -> Sample:
    return Sample(
        sample_id=f"s:{index}",
        session_id="s",
        turn_index=0,
        messages=[],
        response=Response(content="x"),
        next_state=None,
        prompt_ids=[1, 2],
        response_ids=[3],
        score=score,
        votes=[],
        judge_calls=0,
        exclude_reason=None,
        loss_mask=1,
        mode="rl",
        judge=IDENTITY,
        group_id="q" if scores is not None else None,
        group_scores=scores,
        group_index=index,
    )


@pytest.mark.parametrize(
    ("method", "scores", "want"),
    [
        ("none", [1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]),
        ("mean", [1.0, 0.0, 1.0, 1.0], [0.25, -0.75, 0.25, 0.25]),
        ("leave_one_out", [1.0, 0.0, 1.0, 1.0], [1 / 3, -1.0, 1 / 3, 1 / 3]),
        ("mean_std", [1.0, 0.0, 1.0, 1.0], [0.5, -1.5, 0.5, 0.5]),
        # mean 1; centred 2, 0, -1, -1; the others' means 1/3, 1, 4/3, 4/3;
        # std over N - 1 = sqrt((4 + 0 + 1 + 1) / 3) = sqrt(2)
        ("none", [3.0, 1.0, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0]),
        ("mean", [3.0, 1.0, 0.0, 0.0], [2.0, 0.0, -1.0, -1.0]),
        ("leave_one_out", [3.0, 1.0, 0.0, 0.0], [8 / 3, 0.0, -4 / 3, -4 / 3]),
        (
            "mean_std",
            [3.0, 1.0, 0.0, 0.0],
            [math.sqrt(2), 0.0, -1 / math.sqrt(2), -1 / math.sqrt(2)],
        ),
    ],
)
def test_the_trainer_takes_each_samples_advantage_within_its_group(
    method: str, scores: list[float], want: list[float]
) -> None:
    got = [sample_reward(scored(i, scores, score=s), method) for i, s in enumerate(scores)]
    assert got == pytest.approx(want, abs=1e-5)
    # the reward SDK's group_advantages gives the same hand-worked numbers (never a
    # max-normalisation)
    if method != "none":
        assert group_advantages(scores, method) == pytest.approx(want, abs=1e-5)  # type: ignore[arg-type]


def test_ungrouped_samples_keep_their_score_and_tokenized_samples_carry_the_advantage() -> None:
    assert sample_reward(scored(None, None, score=0.7), "mean_std") == 0.7
    tok = tokenize_sample(
        scored(1, [1.0, 0.0], score=0.0), tokenizer=None, max_seq_len=16, group_advantage="mean"
    )
    assert tok.reward == -0.5
    assert TrainerConfig(group_advantage="leave_one_out").group_advantage == "leave_one_out"
    with pytest.raises(ValueError, match="group_advantage"):
        TrainerConfig(group_advantage="max")  # type: ignore[arg-type]
    assert not math.isnan(sample_reward(scored(0, [2.0], score=2.0), "mean_std"))


def test_a_sample_index_outside_its_group_is_refused() -> None:
    with pytest.raises(ValueError, match="outside group_scores"):
        scored(3, [1.0, 0.0])
