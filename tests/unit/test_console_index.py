"""The console's index and figures: bounded memory, extremes per version, the per-version
figures from samples and from the trainer's records on policy.versions."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.console.figures import trainer_figures, version_rows
from pipeline.console.index import ConsoleIndex, teacher_gaps, unanimous
from pipeline.events import JudgeIdentity, Response, Sample


def sample(i: int, score: float = 1.0, version: int | None = 0, **fields: Any) -> Sample:
    base: dict[str, Any] = {
        "sample_id": f"s{i % 3}:{i}",
        "session_id": f"s{i % 3}",
        "turn_index": i,
        "messages": [{"role": "user", "content": f"question {i}"}],
        "response": Response(content="x" * (i % 9 + 1)),
        "next_state": {"role": "user", "content": "thanks"},
        "score": score,
        "votes": [1, 1],
        "judge_calls": 2,
        "exclude_reason": None,
        "loss_mask": 1,
        "mode": "rl",
        "policy_version": version,
        "judge": JudgeIdentity(backend="rules", prompt_version="v1"),
    }
    return Sample(**{**base, **fields})


def test_extremes_keep_the_highest_and_lowest_and_the_newest_on_a_tie() -> None:
    index = ConsoleIndex(max_samples=5, per_version=3)
    scores = [0.5, -0.9, 1.0, 0.1, -0.2, 1.0, -0.9, 0.7]
    for i, score in enumerate(scores):
        index.add_sample(sample(i, score))
    top, bottom = index.extremes(0, 10)
    assert [(s.score, s.turn_index) for s in top] == [(1.0, 5), (1.0, 2), (0.7, 7)]
    assert [(s.score, s.turn_index) for s in bottom] == [(-0.9, 6), (-0.9, 1), (-0.2, 4)]
    assert [s.turn_index for s in index.extremes(0, 1)[0]] == [5]
    assert index.extremes(7, 10) == ([], [])


def test_memory_is_bounded_recent_samples_and_extremes_only() -> None:
    index = ConsoleIndex(max_samples=10, per_version=2, max_versions=3)
    for i in range(500):
        index.add_sample(sample(i, score=float(i % 7) - 3, version=i // 50))
    snap = index.snapshot()
    # 10 recent (all version 9) + at most 4 per kept version (3 versions)
    assert snap.held <= 10 + 3 * 4
    assert index.sample("s1:499") is not None  # the most recent is held
    assert index.sample("s0:3") is None  # version 0: its samples were let go
    assert index.extremes(0, 5) == ([], [])
    assert [s.score for s in index.extremes(8, 5)[0]] == [3.0, 3.0]
    # every version keeps its figures
    assert sorted(snap.tallies) == list(range(10))
    assert all(t.samples == 50 for t in snap.tallies.values())


def test_a_duplicate_of_a_held_sample_is_not_counted_twice() -> None:
    index = ConsoleIndex()
    index.add_sample(sample(1, 1.0))
    index.add_sample(sample(1, 1.0))
    index.add_sample(sample(2, -1.0))
    assert index.snapshot().tallies[0].samples == 2
    assert len(index.extremes(0, 10)[0]) == 2


def test_session_search_finds_held_samples_in_turn_order() -> None:
    index = ConsoleIndex()
    for i in (7, 1, 4, 2):
        index.add_sample(sample(i))
    assert [s.turn_index for s in index.by_session("s1")] == [1, 4, 7]
    assert index.by_session("nobody") == []


def test_unanimous_needs_two_valid_equal_votes() -> None:
    assert unanimous([1, 1, 1]) is True
    assert unanimous([1, None]) is False
    assert unanimous([1, -1, 1]) is False
    assert unanimous([1]) is None


def test_teacher_gaps_are_teacher_minus_rollout_per_token() -> None:
    s = sample(1, teacher_logprobs=[-0.5, -3.0], response_logprobs=[-1.0, -1.0])
    assert teacher_gaps(s) == [0.5, -2.0]
    assert teacher_gaps(sample(2, teacher_logprobs=[-0.5], response_logprobs=None)) is None


def test_trainer_figures_belong_to_the_version_before_the_record() -> None:
    policy = {
        3: {"version": 3, "step_metrics": {"kl": 0.3}},
        1: {"version": 1, "step_metrics": {"kl": 0.1}},
        2: {"version": 2},  # a record without metrics
    }
    assert trainer_figures(policy) == {0: {"kl": 0.1}, 2: {"kl": 0.3}}
    assert trainer_figures({5: {"step_metrics": {"kl": 1}}}) == {4: {"kl": 1}}  # 4 compacted away


def test_version_rows_combine_samples_and_trainer_figures() -> None:
    index = ConsoleIndex()
    for i in range(4):  # version 0: scores 1, 1, -1, -1; one excluded; one split vote
        index.add_sample(
            sample(
                i,
                1.0 if i < 2 else -1.0,
                loss_mask=0 if i == 3 else 1,
                exclude_reason="neutral_score" if i == 3 else None,
                votes=[1, -1, 1] if i == 0 else [1, 1],
            )
        )
    index.add_policy_version(
        {"version": 1, "ts": 5.0, "step_metrics": {"reward_mean": 0.25, "entropy": 2.0}}
    )
    rows = {r.version: r for r in version_rows(index.snapshot())}
    assert set(rows) == {0, 1}
    zero = rows[0]
    assert (zero.samples, zero.score_mean, zero.excluded_share) == (4, 0.0, 0.25)
    assert zero.vote_agreement == pytest.approx(3 / 4)
    assert (zero.train_reward, zero.entropy, zero.kl) == (0.25, 2.0, None)
    assert rows[1].samples == 0 and rows[1].published_ts == 5.0 and rows[1].train_reward is None


def test_length_bias_shows_once_enough_samples_say_so() -> None:
    index = ConsoleIndex()
    for i in range(19):  # longer responses score higher: a judge with a length bias
        index.add_sample(sample(i, score=float(i), response=Response(content="y" * (i + 1))))
    assert version_rows(index.snapshot())[0].length_bias is None  # 19 < 20 points
    index.add_sample(sample(19, score=19.0, response=Response(content="y" * 20)))
    assert version_rows(index.snapshot())[0].length_bias == pytest.approx(1.0)


def test_divergence_flags_reward_up_while_heldout_accuracy_falls() -> None:
    index = ConsoleIndex()
    index.add_policy_version(
        {"version": 1, "heldout_accuracy": 0.8, "step_metrics": {"reward_mean": 0.0}}
    )
    index.add_policy_version({"version": 2, "step_metrics": {"reward_mean": 0.1}})
    index.add_policy_version(
        {"version": 3, "heldout_accuracy": 0.6, "step_metrics": {"reward_mean": 0.5}}
    )
    index.add_policy_version({"version": 4, "step_metrics": {"reward_mean": 0.6}})
    rows = {r.version: r for r in version_rows(index.snapshot())}
    assert rows[3].divergence is not None and "from version 1 to 3" in rows[3].divergence
    assert rows[1].divergence is None and rows[0].divergence is None
