"""The sentinels against reward hacking: per-version rows from the trainer's metrics and the
held-out evaluations, and the divergence of train reward and held-out accuracy."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.learn.sentinels import (
    Divergence,
    SentinelRow,
    divergences,
    heldout_accuracy,
    measure,
    reward_at,
    rows_by_start,
    sentinel_rows,
)


def step(n: int, version: int, reward: float, pushed: bool = True, **kw: Any) -> dict[str, Any]:
    """A trainer metrics row as metrics.jsonl holds it (``version``: after the step)."""
    row = {"step": n, "policy_version": version, "pushed": pushed, "reward_mean": reward}
    return {
        "response_length": 10.0 + n,
        "entropy": 2.0 - 0.1 * n,
        "kl": 0.01 * (n - 1),
        **row,
        **kw,
    }


def result(accuracy: float, *versions: tuple[str, int]) -> dict[str, Any]:
    return {"accuracy": accuracy, "success": 0.0, "versions": dict(versions)}


def test_a_step_describes_the_version_it_started_from() -> None:
    steps = [
        step(1, 1, 0.1),  # started from the initial weights: version 0
        step(2, 2, 0.2),  # from version 1
        step(3, 2, 0.3, pushed=False),  # from version 2; its push failed
        step(4, 3, 0.4),  # from step 3's weights, never pushed: no version's
        step(5, 4, 0.5),  # from version 3
    ]
    got = rows_by_start(steps)
    assert {v: row["step"] for v, row in got.items()} == {0: 1, 1: 2, 2: 3, 3: 5}


def test_held_out_accuracy_by_the_version_that_answered() -> None:
    evaluation = {
        "before": result(0.5, ("0", 20)),
        "periodic": {"4": result(0.45, ("4", 20)), "8": result(0.4)},  # no versions: its key
        "after": result(0.3, ("12", 19), ("11", 1)),  # the final version gave most answers
        "control": result(0.5, ("0", 20)),  # not a version of the learning run
    }
    assert heldout_accuracy(evaluation) == {0: 0.5, 4: 0.45, 8: 0.4, 12: 0.3}
    assert heldout_accuracy({"after": result(0.3)}) == {}  # which version, unknown
    assert heldout_accuracy({}) == {}


def rows(rewards: dict[int, float], accuracy: dict[int, float]) -> list[SentinelRow]:
    return [SentinelRow(v, rewards.get(v), accuracy.get(v)) for v in sorted({*rewards, *accuracy})]


def test_the_reward_at_an_evaluation_is_the_mean_since_the_one_before() -> None:
    series = rows({0: 0.0, 1: 0.2, 2: 0.4, 3: 0.5}, {0: 0.5, 2: 0.4, 4: 0.3})
    assert reward_at(series, None, 0) == 0.0
    assert reward_at(series, 0, 2) == pytest.approx(0.3)  # versions 1 and 2
    assert reward_at(series, 2, 4) == 0.5  # version 3 (4 has no step)
    assert reward_at(series, 3, 4) == 0.5  # none since 3: the last known
    assert reward_at(rows({}, {0: 0.5}), None, 0) is None


def test_reward_up_while_accuracy_down_is_a_divergence() -> None:
    rewards = {0: -0.2, 1: 0.0, 2: 0.1, 3: 0.3, 4: 0.35, 5: 0.4}
    series = rows(rewards, {0: 0.50, 2: 0.49, 4: 0.40, 6: 0.45})
    [found] = divergences(series)
    # at version 2: reward mean(0.0, 0.1) - (-0.2) = +0.25, accuracy -0.01: no divergence;
    # at 4: mean(0.3, 0.35) - 0.05 = +0.275, accuracy -0.09: a divergence;
    # at 6: the last known since 4 (0.4) - 0.325 = +0.075: not up enough
    assert (found.version, found.since) == (4, 2)
    assert found.reward_change == pytest.approx(0.275)
    assert found.accuracy_change == pytest.approx(-0.09)
    assert found.reason == "train reward +0.275 while held-out accuracy -0.090 from version 2 to 4"
    [wide] = divergences(series, window=3)  # 0 against 4: +0.525, -0.10; 2 against 6: -0.04
    assert (wide.version, wide.since) == (4, 0)
    assert divergences(series, reward_rise=0.3) == []


@pytest.mark.parametrize(
    ("rewards", "accuracy"),
    [
        ({0: 0.0, 2: 0.5}, {0: 0.5, 2: 0.46}),  # accuracy down 0.04 only
        ({0: 0.0, 2: 0.1}, {0: 0.5, 2: 0.3}),  # reward up 0.1 only: not more than it
        ({0: 0.5, 2: 0.0}, {0: 0.5, 2: 0.3}),  # both down: a worse policy, not a hack
        ({0: 0.0, 2: 0.5}, {0: 0.5, 2: 0.7}),  # both up: learning
        ({2: 0.5}, {0: 0.5, 2: 0.3}),  # no reward before version 0's evaluation
    ],
)
def test_what_is_no_divergence(rewards: dict[int, float], accuracy: dict[int, float]) -> None:
    assert divergences(rows(rewards, accuracy)) == []


def test_a_window_below_two_evaluations_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 evaluations"):
        divergences([], window=1)


def test_the_sentinels_of_a_run_from_its_metrics_and_evaluations() -> None:
    steps = [step(1, 1, 0.0), step(2, 2, 0.2), step(3, 3, 0.4), step(4, 4, 0.6)]
    evaluation = {
        "before": result(0.5, ("0", 10)),
        "periodic": {"2": result(0.48, ("2", 10))},
        "after": result(0.4, ("4", 10)),
    }
    assert [r.version for r in sentinel_rows(steps, evaluation)] == [0, 1, 2, 3, 4]
    found = measure(steps, evaluation)  # reward at 0: 0.0, at 2: mean(0.2, 0.4), at 4: 0.6
    assert found.divergence == [Divergence(4, 2, pytest.approx(0.3), pytest.approx(-0.08))]
    out = found.to_json()
    assert out["per_version"][0] == {
        "version": 0, "reward_mean": 0.0, "heldout_accuracy": 0.5, "response_length": 11.0,
        "entropy": 1.9, "kl": 0.0,
    }  # fmt: skip
    assert out["per_version"][1]["heldout_accuracy"] is None  # not evaluated
    assert out["per_version"][4] == {
        "version": 4,
        "reward_mean": None,
        "heldout_accuracy": 0.4,
        "response_length": None,
        "entropy": None,
        "kl": None,
    }  # fmt: skip: no step started from the final version
    assert (
        out["divergence"][0]["version"] == 4
        and "from version 2 to 4" in (out["divergence"][0]["reason"])
    )
    assert out["rule"] == {"window": 2, "reward_rise": 0.1, "accuracy_fall": 0.05}
    last = found.last_accuracy
    assert last is not None and (last.version, last.heldout_accuracy) == (4, 0.4)


def test_in_opd_the_training_signal_is_the_teacher_gap() -> None:
    """opd's reward is 0 by construction: its north star is teacher - old, and a gap that
    rises while held-out accuracy falls is the same divergence."""
    steps = [
        step(n, n, 0.0, mode="opd", teacher_gap=gap)
        for n, gap in enumerate([-0.3, -0.1, 0.1, 0.2], start=1)
    ]
    evaluation = {"before": result(0.25, ("0", 9)), "after": result(0.03, ("4", 9))}
    rows = sentinel_rows(steps, evaluation)
    assert [r.reward_mean for r in rows] == [-0.3, -0.1, 0.1, 0.2, None]
    # gap at version 0: -0.3; at 4: the mean of versions 1-3 since, (-0.1 + 0.1 + 0.2) / 3
    assert measure(steps, evaluation).divergence == [
        Divergence(4, 0, pytest.approx(0.2 / 3 + 0.3), pytest.approx(-0.22))
    ]
    combine = [step(1, 1, 0.4, mode="combine", teacher_gap=-2.0)]
    assert sentinel_rows(combine, {})[0].reward_mean == 0.4  # combine has a reward
