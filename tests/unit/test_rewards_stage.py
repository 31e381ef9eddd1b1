"""Reward processors in the judging stage: FAILED to samples.retry, then dead letters; 0 trains."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from pipeline.events import (
    DeadLetter,
    JudgeIdentity,
    NextState,
    Paired,
    Response,
    RetryRecord,
    Sample,
    Turn,
    decode_as,
    encode,
)
from pipeline.judge.client import JudgeUnavailable
from pipeline.judge.rules import RulesJudge
from pipeline.rewards import HybridReward, RewardInput, RewardOutput
from pipeline.scoring.build import build_stage, load_rewards
from pipeline.scoring.groups import GroupScorer
from pipeline.scoring.retry import RetryReport, _route
from pipeline.scoring.scorers import (
    ByGroup,
    PrmScorer,
    ProcessorScorer,
    judge_calls_of,
    score_with_processor,
)
from pipeline.scoring.stages import JudgeStage
from pipeline.settings import ScoringSettings, Settings

IDENTITY = JudgeIdentity(backend="rules", prompt_version="v1")
SETTINGS = Settings()


def paired(next_state: bool = True, attempt: int = 1) -> Paired:
    turn = Turn(
        type="turn",
        session_id="s1",
        ts=1.0,
        turn_index=3,
        turn_type="main",
        messages=[{"role": "user", "content": "list the files"}],
        response=Response(content="a.txt b.txt"),
    )
    return Paired(
        sample_id=turn.sample_id,
        turn=turn,
        next_state=NextState(role="user", content="thanks") if next_state else None,
        first_judged=False,
        paired_ts=1.0,
        attempt=attempt,
    )


class Fixed:
    """A processor with a fixed answer, counting its calls."""

    def __init__(self, out: RewardOutput) -> None:
        self.out, self.calls = out, 0

    def setup(self) -> None: ...

    async def process(self, input: RewardInput) -> RewardOutput:
        self.calls += 1
        return self.out


def test_a_zero_reward_is_a_trained_sample_with_its_metrics() -> None:
    proc = Fixed(RewardOutput.success(0.0, {"rule": 0.0, "model/judge_calls": 3.0}))
    sample = asyncio.run(score_with_processor(paired(), proc, IDENTITY))
    assert (sample.score, sample.loss_mask, sample.exclude_reason) == (0.0, 1, None)
    assert sample.reward_metrics == {"rule": 0.0, "model/judge_calls": 3.0}
    assert sample.judge_calls == 3 and sample.mode == "rl"
    assert decode_as(Sample, encode(sample)) == sample  # the schema carries the metrics


def test_failed_is_not_a_score() -> None:
    proc = Fixed(RewardOutput.failed("judge timed out"))
    with pytest.raises(JudgeUnavailable, match="judge timed out"):
        asyncio.run(score_with_processor(paired(), proc, IDENTITY))


def test_a_turn_without_next_state_is_excluded_without_asking() -> None:
    proc = Fixed(RewardOutput.success(1.0))
    sample = asyncio.run(score_with_processor(paired(next_state=False), proc, IDENTITY))
    assert proc.calls == 0
    assert (sample.loss_mask, sample.exclude_reason) == (0, "no_next_state")


def test_judge_calls_are_summed_from_every_processor() -> None:
    assert judge_calls_of({"judge_calls": 2.0, "a/model/judge_calls": 3.0, "calls": 9.0}) == 5


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    def send(self, topic: str, key: Any = None, value: bytes = b"") -> str:
        self.records.append((topic, value))
        return "future"


def test_failed_goes_to_retry_and_is_dead_lettered_after_its_attempts() -> None:
    topics = SETTINGS.topics
    proc = Fixed(RewardOutput.failed("judge timed out"))
    stage = JudgeStage(topics, ProcessorScorer(proc, RulesJudge().identity))
    report, pair, dead = RetryReport(), paired(), None
    for attempt in range(1, 4):
        outs = asyncio.run(stage.handle(encode(pair), b"s1", f"turns.paired/0/{attempt}"))
        assert [o.topic for o in outs] == [topics.samples_retry.name]  # never samples.scored
        retry = decode_as(RetryRecord, outs[0].value)
        assert retry.attempts == attempt and "judge timed out" in retry.error
        sent = Sent()
        rec = SimpleNamespace(
            value=outs[0].value, key=b"s1", topic=topics.samples_retry.name, partition=0, offset=0
        )
        _route(rec, sent, SETTINGS, 3, report)
        topic, value = sent.records[0]
        if topic == topics.turns_paired.name:  # requeued: judged again, attempt + 1
            pair = decode_as(Paired, value)
            assert pair.attempt == attempt + 1
        else:
            dead = decode_as(DeadLetter, value)
    assert proc.calls == 3 and report.requeued == 2 and report.dead_lettered == 1
    assert dead is not None and dead.stage == "retry" and "judge timed out" in dead.error


def test_a_failed_rule_makes_no_judge_call_through_the_stage() -> None:
    rule = Fixed(RewardOutput.success(0.0))
    model = Fixed(RewardOutput.success(1.0, {"judge_calls": 3.0}))
    hybrid = HybridReward(rule=rule, model=model, w_rule=0.2, w_model=0.8)
    stage = JudgeStage(SETTINGS.topics, ProcessorScorer(hybrid, RulesJudge().identity))
    outs = asyncio.run(stage.handle(encode(paired()), b"s1", "turns.paired/0/7"))
    sample = decode_as(Sample, outs[0].value)
    assert model.calls == 0 and rule.calls == 1
    assert sample.score == 0.0 and sample.loss_mask == 1 and sample.judge_calls == 0


def test_rewards_are_for_rl_mode_only(tmp_path: Path) -> None:
    config = tmp_path / "rewards.yaml"
    config.write_text("processors:\n  - classpath: examples.rewards.refusal:SafetyProcessor\n")
    with pytest.raises(ValidationError, match="rl mode only"):
        ScoringSettings(mode="opd", rewards=config)
    rl = SETTINGS.scoring.model_copy(update={"rewards": config})
    assert load_rewards(SETTINGS.model_copy(update={"scoring": rl})) is not None
    assert load_rewards(SETTINGS) is None


def test_the_worker_tracks_the_judges_length_bias_without_reward_processors() -> None:
    from prometheus_client import REGISTRY

    stage = JudgeStage(SETTINGS.topics, PrmScorer(RulesJudge(), "rl"))
    for i in range(30):
        pair = paired()
        turn = pair.turn.model_copy(
            update={"turn_index": i, "response": Response(content="x" * (10 + i))}
        )
        reply = "thanks, that works" if i % 2 else "that's wrong, please redo it"
        pair = pair.model_copy(
            update={"turn": turn, "next_state": NextState(role="user", content=reply)}
        )
        asyncio.run(stage.handle(encode(pair), b"s1", f"turns.paired/0/{i}"))
    value = stage.length_bias.value()
    assert value is not None and -1.0 <= value <= 1.0
    labels = {"processor": "judge", "method": "spearman"}
    assert REGISTRY.get_sample_value("turnstream_reward_length_bias", labels) == value


def test_an_answer_with_no_text_is_judged_and_trains_its_end_of_turn_token(
    tiny_tokenizer: Path,
) -> None:
    from transformers import AutoTokenizer

    from pipeline.training.batch import tokenize_sample
    from pipeline.turn_tokens import end_of_turn_id

    pair = paired()
    ended = pair.turn.model_copy(
        update={"response": Response(content=None, finish_reason="stop"), "response_ids": []}
    )
    reply = NextState(role="user", content="No, too long. Try again, shorter please.")
    pair = pair.model_copy(update={"turn": ended, "next_state": reply})
    stage = JudgeStage(SETTINGS.topics, PrmScorer(RulesJudge(), "rl"))
    [out] = asyncio.run(stage.handle(encode(pair), b"s1", "turns.paired/0/0"))
    sample = decode_as(Sample, out.value)
    assert out.topic == SETTINGS.topics.samples_scored.name
    assert sample.loss_mask == 1 and sample.score == -1.0
    tok = AutoTokenizer.from_pretrained(tiny_tokenizer)
    trained = tokenize_sample(sample, tok, 64)
    assert trained.response_ids == [end_of_turn_id(tok)]  # the action: ending the turn


def test_the_worker_and_rescore_build_the_scorer_the_settings_describe(tmp_path: Path) -> None:
    processors = "processors:\n  - classpath: examples.rewards.refusal:SafetyProcessor\n"
    group = "group:\n  classpath: examples.rewards.group:DemoGroupRewardProcessor\n"

    def scorer(rewards: str | None) -> Any:
        path = None
        if rewards is not None:
            path = tmp_path / f"rewards-{len(list(tmp_path.iterdir()))}.yaml"
            path.write_text(rewards)
        scoring = SETTINGS.scoring.model_copy(update={"rewards": path})
        return build_stage(SETTINGS.model_copy(update={"scoring": scoring})).scorer

    judge = scorer(None)
    assert isinstance(judge, PrmScorer) and judge.kind == "judge"
    assert isinstance(judge.judge, RulesJudge)
    per_turn = scorer(processors)
    assert isinstance(per_turn, ProcessorScorer) and per_turn.kind == "rewards"
    assert isinstance(scorer(group), GroupScorer)
    both = scorer(processors + group)
    assert isinstance(both, ByGroup) and both.kind == "rewards"
    assert isinstance(both.groups, GroupScorer) and isinstance(both.ungrouped, ProcessorScorer)
    assert both.identity == judge.identity == RulesJudge().identity
