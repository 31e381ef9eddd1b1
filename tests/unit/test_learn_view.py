"""learn's live view: a table in a terminal, a plain progress line in a pipe; the sentinels'
marks in both, and the WARN line when a divergence shows."""

from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from pipeline.learn.loop import DivergenceWatch, last_reward
from pipeline.learn.report import VersionStats
from pipeline.learn.sentinels import Divergence, SentinelRow, Sentinels
from pipeline.learn.view import LiveView, Snapshot, live_table, progress_line

SENTINELS = Sentinels(
    [SentinelRow(0, 0.1, 0.5), SentinelRow(1, 0.3), SentinelRow(2, 0.4, 0.42)],
    [Divergence(2, 0, 0.3, -0.08)],
)
SNAPSHOT = Snapshot(
    phase="learning",
    elapsed_s=125.4,
    served_version=2,
    turns=48,
    turns_per_s=0.38,
    paused=True,
    failures=0,
    steps=2,
    max_steps=16,
    samples_trained=32,
    waiting=16,
    last_push_ts=None,
    versions=[VersionStats(0, 32, 0.25, 12.0, 30, 0.1), VersionStats(2, 16, 0.5, 8.0, 14, 0.4)],
    last_reward=0.4,
    sentinels=SENTINELS,
)


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=200), out


def test_the_progress_line_says_where_the_run_is() -> None:
    assert progress_line(SNAPSHOT) == (
        "learning 125s: serving v2, steps 2/16, turns 48 (users paused), samples trained 32 "
        "(16 waiting), reward mean +0.400, held-out accuracy 0.420 (v2), DIVERGENCE at v2"
    )
    early = dataclasses.replace(
        SNAPSHOT, paused=False, failures=1, last_reward=None, sentinels=Sentinels([], [])
    )
    assert progress_line(early) == (
        "learning 125s: serving v2, steps 2/16, turns 48, samples trained 32 (16 waiting), "
        "reward mean -, held-out accuracy -, failed sessions 1"
    )


def test_in_a_pipe_a_line_every_ten_seconds_and_the_last_one_at_the_end() -> None:
    out_console, out = console(terminal=False)
    now = [0.0]
    view = LiveView(out_console, clock=lambda: now[0])
    assert view.live is None
    with view:
        for t, steps in ((0.0, 0), (4.0, 1), (9.9, 2), (10.0, 3), (15.0, 4), (19.0, 5)):
            now[0] = t
            view.show(dataclasses.replace(SNAPSHOT, steps=steps))
    lines = out.getvalue().splitlines()
    assert [line.split("steps ")[1].split("/")[0] for line in lines] == ["0", "3", "5"]
    assert all(line.startswith("learning 125s: serving v2") for line in lines)
    assert "\x1b[" not in out.getvalue()  # plain text: no colour codes, no cursor moves


def test_nothing_unshown_is_printed_twice_at_the_end() -> None:
    out_console, out = console(terminal=False)
    with LiveView(out_console, clock=lambda: 0.0) as view:
        view.show(SNAPSHOT)
    assert len(out.getvalue().splitlines()) == 1


def test_in_a_terminal_the_live_table_stays() -> None:
    out_console, out = console(terminal=True)
    view = LiveView(out_console)
    assert view.live is not None
    with view:
        view.show(SNAPSHOT)
    text = out.getvalue()
    assert "turnstream learn: learning (125s)" in text and "samples trained" in text
    assert "serving v2, steps" not in text  # no progress line


def test_the_live_table_marks_the_held_out_accuracy_and_the_divergence() -> None:
    out_console, out = console(terminal=False)
    out_console.print(live_table(SNAPSHOT))
    text = out.getvalue()
    assert "train reward mean (last step)" in text and "+0.40" in text
    assert "held-out accuracy 0.50" in text  # version 0's row
    assert "!! divergence at v2" in text
    assert "train reward +0.300 while held-out accuracy -0.080 from version 0 to 2" in text


def step(n: int, reward: float) -> dict[str, object]:
    return {"step": n, "policy_version": n, "pushed": True, "reward_mean": reward}


def test_a_divergence_is_warned_of_once_as_the_evaluation_shows_it() -> None:
    out_console, out = console(terminal=False)
    steps = [step(1, 0.0), step(2, 0.1), step(3, 0.3), step(4, 0.4)]
    evaluation: dict[str, object] = {"before": {"accuracy": 0.5, "versions": {"0": 10}}}
    watch = DivergenceWatch(out_console, evaluation, steps)
    assert watch.check(steps).divergence == [] and out.getvalue() == ""
    evaluation["periodic"] = {"3": {"accuracy": 0.4, "versions": {"3": 10}}}  # filled later
    assert [d.version for d in watch.check(steps).divergence] == [3]
    watch.check(steps)
    [warning] = out.getvalue().splitlines()
    assert warning.startswith("WARN divergence at policy version 3: train reward +0.267")
    again, later = console(terminal=False)
    DivergenceWatch(again, evaluation, steps).check(steps)  # a later phase: shown already
    assert later.getvalue() == ""


def test_the_last_reward_is_the_trainers_last_steps() -> None:
    assert last_reward([]) is None
    assert last_reward([step(1, 0.25), step(2, -0.5)]) == -0.5
    assert last_reward([{"step": 1}]) is None


def test_an_evaluation_says_how_many_answers_are_in_every_ten_seconds() -> None:
    from pipeline.learn.evaluate import EvalProgress

    said: list[str] = []
    now = [100.0]
    progress = EvalProgress("before", said.append, every_s=10.0, clock=lambda: now[0])
    for done, at in [(1, 101.0), (5, 109.9), (9, 110.0), (12, 115.0), (30, 120.5), (93, 140.0)]:
        now[0] = at
        progress(done, 93)
    assert said == [
        "held-out (before): 9 of 93 answered, 10s",
        "held-out (before): 30 of 93 answered, 20s",
    ]  # none for the last answer: the result line follows it
