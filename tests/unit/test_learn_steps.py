"""The step-time split of a run's report, from hand-written trainer metrics rows."""

from __future__ import annotations

from pipeline.learn.steps import step_split


def test_the_split_averages_the_steps_after_the_first_and_counts_the_pushes() -> None:
    rows = [
        {"step": 1, "time_s": {"wait": 30.0, "train": 6.0, "push": 2.0, "checkpoint": 3.0},
         "push": {"kind": "full", "bytes": 538}},
        {"step": 2, "time_s": {"wait": 4.0, "train": 5.0, "push": 0.5, "checkpoint": 1.0},
         "push": {"kind": "delta", "bytes": 113}},
        {"step": 3, "time_s": {"wait": 6.0, "train": 7.0, "push": 0.7, "checkpoint": 2.0},
         "push": None},
        {"step": 0, "loss": 1.0},  # an old row without times
    ]  # fmt: skip
    split = step_split(rows)
    assert split["steps"] == 3 and split["first_wait_s"] == 30.0
    assert split["mean_s"] == {"wait": 5.0, "train": 6.0, "push": 0.6, "checkpoint": 1.5}
    assert split["step_s"] == 13.1
    assert split["pushes"] == {
        "full": {"count": 1, "mean_bytes": 538.0},
        "delta": {"count": 1, "mean_bytes": 113.0},
    }


def test_one_step_is_its_own_mean_and_no_rows_say_nothing() -> None:
    one = step_split([{"time_s": {"wait": 9.0, "train": 1.0, "push": 1.0, "checkpoint": 1.0}}])
    assert one["mean_s"]["wait"] == 9.0 and one["step_s"] == 12.0
    none = step_split([])
    assert none["steps"] == 0 and none["step_s"] is None and none["first_wait_s"] is None
    assert none["pushes"]["delta"] == {"count": 0, "mean_bytes": None}
