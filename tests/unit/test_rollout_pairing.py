"""A rollout attempt's pairs wait for its session's end: trained only when it succeeded."""

from __future__ import annotations

import asyncio

from pipeline.events import Paired, Sample, SessionEnd, Turn, decode_as, encode
from pipeline.judge.rules import RulesJudge
from pipeline.scoring.pairing import SessionState, pair_step
from pipeline.scoring.scorers import PrmScorer
from pipeline.scoring.stages import JudgeStage
from pipeline.settings import KafkaSettings, Settings
from tests.unit.test_pairing import IDLE

SETTINGS = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"), topic_prefix="tr.")


def turn(index: int, last: str, role: str = "user", rollout: bool = True) -> Turn:
    call = {"tool_call_id": "c1"} if role == "tool" else {}
    return Turn.model_validate(
        {"type": "turn", "session_id": "r", "turn_index": index, "turn_type": "main",
         "messages": [{"role": role, "content": last, **call}],
         "response": {"content": f"answer {index}"}, "ts": 100.0 + index, "rollout": rollout,
         "group_id": "rollout:t", "group_size": 2}
    )  # fmt: skip


def end(reason: str, **metrics: float) -> SessionEnd:
    return SessionEnd(
        type="session_end",
        session_id="r",
        ts=1e5,  # after an idle timeout from the last turn
        reason=reason,
        rollout_metrics=metrics,  # type: ignore[arg-type]
    )


def run(events: list) -> tuple[list[Paired], list[str], SessionState | None]:  # type: ignore[type-arg]
    state: SessionState | None = None
    pairs: list[Paired] = []
    outcomes: list[str] = []
    for i, event in enumerate(events):
        # each step from the stored form, as the worker's table gives it
        step = pair_step(
            SessionState.from_dict(state.to_dict()) if state else None, event, 1000.0 + i, IDLE
        )
        state = step.state
        pairs.extend(step.pairs)
        outcomes.append(step.outcome)
    return pairs, outcomes, state


def test_a_successful_rollout_emits_its_pairs_at_its_end_with_its_metrics() -> None:
    pairs, outcomes, state = run(
        [
            turn(0, "search"),
            turn(1, "3 results", role="tool"),
            turn(2, "thanks"),
            end("client", calls=3.0),
        ]
    )
    assert outcomes == ["pending", "held", "held", "rollout_ended"]
    assert state is None
    assert [p.sample_id for p in pairs] == ["r:0", "r:1", "r:2"]
    assert pairs[0].next_state is not None and pairs[0].next_state.role == "tool"
    assert pairs[0].next_state.tool_call_id == "c1"
    assert [p.first_judged for p in pairs] == [True, False, False]
    assert pairs[2].next_state is None
    assert all(p.exclude_reason is None and p.rollout_metrics == {"calls": 3.0} for p in pairs)


def test_a_failed_or_idle_rollout_has_every_pair_excluded() -> None:
    for reason in ("rollout_failed", "idle_timeout"):
        pairs, outcomes, _ = run([turn(0, "a"), turn(1, "b"), end(reason)])
        assert outcomes[-1] == "rollout_failed"
        assert [(p.sample_id, p.exclude_reason) for p in pairs] == [
            ("r:0", "rollout_failed"),
            ("r:1", "rollout_failed"),
        ]
        assert all(p.rollout_metrics == {} for p in pairs)


def test_a_plain_session_still_pairs_at_once() -> None:
    pairs, outcomes, state = run([turn(0, "a", rollout=False), turn(1, "b", rollout=False)])
    assert outcomes == ["pending", "paired"] and [p.sample_id for p in pairs] == ["r:0"]
    assert state is not None and "held" not in state.to_dict()  # stored as before


def judge(pair: Paired) -> Sample:
    stage = JudgeStage(SETTINGS.topics, PrmScorer(RulesJudge(), "rl"))
    outs = asyncio.run(stage.handle(encode(pair), None, "t/0/0"))
    assert len(outs) == 1 and outs[0].topic == SETTINGS.topics.samples_scored.name
    return decode_as(Sample, outs[0].value)


def test_an_excluded_pair_is_recorded_unjudged_and_metrics_reach_the_sample() -> None:
    failed, _, _ = run([turn(0, "a"), turn(1, "thanks"), end("rollout_failed")])
    sample = judge(failed[0])
    assert (sample.loss_mask, sample.exclude_reason, sample.judge_calls) == (0, "rollout_failed", 0)
    assert sample.group_id == "rollout:t"
    good, _, _ = run([turn(0, "a"), turn(1, "thanks, perfect"), end("client", calls=2.0)])
    sample = judge(good[0])
    assert sample.judge_calls > 0 and sample.loss_mask == 1
    assert sample.reward_metrics == {"rollout/calls": 2.0}
