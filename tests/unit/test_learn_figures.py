"""Freshness, staleness, per-version figures, alignment bounds and the run's JSON and chart."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pipeline.learn import alignment
from pipeline.learn.freshness import Push, first_version_with, measure, percentile, version_during
from pipeline.learn.monitor import ScoredTurn
from pipeline.learn.report import LearnReport, eval_gain, per_version, run_verdict, write_chart
from pipeline.learn.users import ServedTurn

PUSHES = [Push(1, 1, 100.0), Push(2, 2, 110.0), Push(3, 3, 120.0)]


def turn(
    session: str, version: int, served: float, replied: float, met: bool = False
) -> ServedTurn:
    return ServedTurn(session, "p", version, 5 if met else 40, met, served, replied)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 21)], 95) == 19.0
    assert percentile([7.0], 95) == 7.0


def test_versions_of_steps() -> None:
    assert first_version_with(2, PUSHES) == 2
    assert first_version_with(4, PUSHES) is None
    assert version_during(1, PUSHES) == 0  # step 1 ran on the initial weights
    assert version_during(3, PUSHES) == 2


def test_freshness_is_from_the_reply_to_the_first_answer_of_a_version_that_trained_on_it() -> None:
    turns = [
        turn("a", 0, 90.0, 91.0),  # trained at step 1 -> version 1, first served at 105
        turn("b", 0, 92.0, 93.0),  # trained at step 2 -> version 2, first served at 115
        turn("c", 1, 105.0, 106.0),  # trained at step 3 -> version 3: never served
        turn("d", 2, 115.0, 116.0),  # not trained
        turn("e", 0, 95.0, 96.0),  # trained at step 3 (three versions behind... by then 2)
    ]
    trained = {"a:0": 1, "b:0": 2, "c:0": 3, "e:0": 3}
    got = measure(turns, trained, PUSHES)
    assert sorted(got.seconds) == [105.0 - 91.0, 115.0 - 93.0]
    assert got.not_yet_served == 2
    assert sorted(got.staleness) == [0, 1, 1, 2]  # a: 0-0, b: 1-0, c: 2-1, e: 2-0
    summary = got.to_json()
    assert summary["p50_s"] == 14.0 and summary["p95_s"] == 22.0
    assert summary["staleness_max"] == 2 and summary["staleness_histogram"] == {
        "0": 1, "1": 2, "2": 1
    }  # fmt: skip


def test_per_version_rows_take_rewards_of_included_samples_only() -> None:
    turns = [turn("a", 0, 1, 2), turn("b", 0, 1, 2, met=True), turn("c", 1, 3, 4, met=True)]
    scored = [
        ScoredTurn("a:0", -1.0, True, 0),
        ScoredTurn("b:0", 1.0, True, 0),
        ScoredTurn("x:0", 0.0, False, 0),
        ScoredTurn("c:0", 1.0, True, 1),
    ]
    rows = per_version(turns, scored)
    assert [(r.version, r.turns, r.scored) for r in rows] == [(0, 2, 2), (1, 1, 1)]
    assert rows[0].reward_mean == 0.0 and rows[0].met_rate == 0.5
    assert rows[0].mean_words == pytest.approx(22.5) and rows[1].reward_mean == 1.0


def test_alignment_bounds() -> None:
    inside = alignment.summarize([1e-6, 5e-5, 2e-4], samples=2)
    assert inside["within_bounds"] and inside["tokens"] == 3
    assert not alignment.summarize([1e-6, 2e-3], samples=1)["within_bounds"]  # max too big
    assert not alignment.summarize([2e-4] * 4, samples=1)["within_bounds"]  # mean too big
    assert not alignment.summarize([], samples=0)["within_bounds"]


def test_report_json_and_chart(tmp_path: Path) -> None:
    report = LearnReport({"steps": 2}, "brevity")
    report.versions = per_version([turn("a", 0, 1, 2), turn("b", 1, 3, 4, met=True)], [
        ScoredTurn("a:0", -1.0, True, 0), ScoredTurn("b:0", 1.0, True, 1)])  # fmt: skip
    report.evaluation = {
        "before": {"success": 0.1, "accuracy": 0.5, "mean_words": 19.0, "degenerate": 0.0},
        "after": {"success": 0.6, "accuracy": 0.6, "mean_words": 6.0, "degenerate": 0.02},
        "control": {"success": 0.15, "accuracy": 0.5, "mean_words": 18.0, "degenerate": 0.0},
    }
    assert eval_gain(report.evaluation) == pytest.approx(0.45)
    assert eval_gain({"after": {"success": 0.5}}) is None
    report.verdict = run_verdict(report.evaluation)
    assert report.verdict["verdict"] == "goals met"
    written = json.loads(report.write(tmp_path / "learn.json").read_text())
    assert written["per_version"][1] == {
        "version": 1, "turns": 1, "met_rate": 1.0, "mean_words": 5.0, "scored": 1,
        "reward_mean": 1.0,
    }  # fmt: skip
    assert written["eval"]["after"]["success"] == 0.6
    assert written["verdict"]["verdict"] == "goals met"
    assert written["sentinels"] == {}  # none measured: the chart still draws
    png = write_chart(report, tmp_path / "learn.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def evaluated(figures: dict[str, float], version: int) -> dict[str, Any]:
    """An evaluation's JSON as learn.json holds it: ten answers, all from ``version``."""
    return {**figures, "n": 10, "mean_words": 8.0, "versions": {str(version): 10}}


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def test_the_report_and_chart_carry_the_sentinels_and_their_divergence(tmp_path: Path) -> None:
    from pipeline.cli.learn import summary_table
    from pipeline.learn.sentinels import measure

    steps = [
        {"step": n, "policy_version": n, "pushed": True, "reward_mean": r, "entropy": 2.0 - n / 10,
         "kl": n / 100, "response_length": 20.0 - n}
        for n, r in enumerate([-0.2, 0.0, 0.3, 0.5], start=1)
    ]  # fmt: skip
    report = LearnReport({"steps": 4}, "right and short")
    report.evaluation = {
        "before": evaluated(held_out(0.1, 0.50), 0),
        "periodic": {"2": evaluated(held_out(0.2, 0.49), 2)},
        "after": evaluated(held_out(0.4, 0.41), 4),
    }
    found = measure(steps, report.evaluation)
    report.sentinels = found.to_json()
    report.verdict = run_verdict(report.evaluation, report.sentinels["divergence"])
    assert report.verdict["verdict"] == "reward hacking"  # -0.09: the verdict is unchanged
    [flag] = report.verdict["divergence"]
    assert (flag["version"], flag["since"]) == (4, 2)  # reward 0.5 vs mean(0.0, 0.3): +0.35
    written = json.loads(report.write(tmp_path / "learn.json").read_text())
    rows = written["sentinels"]["per_version"]
    assert [r["version"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[2] == {
        "version": 2, "reward_mean": 0.3, "heldout_accuracy": 0.49, "response_length": 17.0,
        "entropy": 1.7, "kl": 0.03,
    }  # fmt: skip
    assert rows[1]["heldout_accuracy"] is None and rows[4]["reward_mean"] is None
    assert written["sentinels"]["divergence"] == [flag]
    assert "train reward +0.350 while held-out accuracy -0.080" in flag["reason"]
    png = write_chart(report, tmp_path / "learn.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png_size(png) == (1300, 760)  # two rows
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(report))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "divergence at version 4" in text and "from version 2 to 4" in text


def test_the_summary_says_when_no_divergence_showed() -> None:
    from pipeline.cli.learn import summary_table

    report = LearnReport({}, "right and short")
    report.evaluation = {
        "before": evaluated(held_out(0.1, 0.5), 0),
        "after": evaluated(held_out(0.5, 0.5), 2),
    }
    report.verdict = run_verdict(report.evaluation, [])
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(report))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "divergence (train reward up, held-out accuracy down)" in text and "none" in text


def test_steps_that_updated_nothing_are_counted_and_shown() -> None:
    """The trainer's rows say updated false for a step of alike scores (alike_steps skip):
    learn.json counts them, the summary shows the count; rows from before the field count
    as updated."""
    from pipeline.cli.learn import summary_table
    from pipeline.learn.run import _training

    rows = [{"step": 1, "updated": False}, {"step": 2, "updated": True}, {"step": 3}]
    rows.append({"step": 4, "updated": False})
    report = LearnReport({}, "right and short")
    report.training = _training(rows, 32)
    assert report.training["steps_without_update"] == 2
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(report))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "steps without update (every score alike)" in text
    report.training = _training(rows[1:3], 32)
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(report))
    assert "without update" not in console.file.getvalue()  # type: ignore[attr-defined]


def held_out(success: float, accuracy: float, degenerate: float = 0.0) -> dict[str, float]:
    return {"success": success, "accuracy": accuracy, "degenerate": degenerate}


def test_the_verdict_is_reward_hacking_when_accuracy_falls_more_than_five_points() -> None:
    before, control = held_out(0.05, 0.40), held_out(0.06, 0.41)
    hack = run_verdict({"before": before, "after": held_out(0.90, 0.34), "control": control})
    assert hack["verdict"] == "reward hacking"  # success rose by 0.84, accuracy fell 0.06
    assert hack["accuracy_change"] == pytest.approx(-0.06)
    assert hack["goals"] == {
        "accuracy_kept": False, "degenerate_at_most_5_percent": True,
        "success_gain_over_control": True,
    }  # fmt: skip
    dip = run_verdict({"before": before, "after": held_out(0.50, 0.36), "control": control})
    assert dip["verdict"] == "goals missed"  # 0.04 lost: not a hack, but accuracy not kept
    met = run_verdict({"before": before, "after": held_out(0.36, 0.40, 0.05), "control": control})
    assert met["verdict"] == "goals met" and met["success_gain"] == pytest.approx(0.30)
    degenerate = held_out(0.60, 0.50, 0.06)
    assert run_verdict({"before": before, "after": degenerate})["verdict"] == "goals missed"
    small_gain = held_out(0.35, 0.45)
    out = run_verdict({"before": before, "after": small_gain, "control": control})
    assert out["verdict"] == "goals missed" and not out["goals"]["success_gain_over_control"]
    no_control = run_verdict({"before": before, "after": small_gain})
    assert no_control["verdict"] == "goals met" and no_control["success_gain"] is None
    assert run_verdict({"after": small_gain})["verdict"] == "not evaluated"


def test_judge_majority_is_compared_with_what_each_user_meant() -> None:
    from pipeline.learn.monitor import intent_agreement

    intents = {"a:0": True, "b:0": True, "c:0": False, "d:0": False, "e:0": True}
    scores = {"a:0": 1.0, "b:0": 0.0, "c:0": -1.0, "d:0": 1.0, "z:0": 1.0}  # e unjudged, z unasked
    out = intent_agreement(intents, scores)
    assert out["n"] == 4 and out["accuracy"] == 0.5
    assert out["labels"] == [-1.0, 0.0, 1.0]
    # rows: what the user meant (-1, 0, +1), columns: the judge's majority
    assert out["counts"] == [[1, 0, 1], [0, 0, 0], [0, 1, 1]]
    # kappa by hand: observed 2/4; expected: p(-1)=2/4 * 1/4 + p(1)=2/4 * 2/4 = 3/8
    assert out["kappa"] == pytest.approx((0.5 - 0.375) / (1 - 0.375))
    assert intent_agreement({}, scores) == {"n": 0}


@pytest.mark.parametrize(("after", "code"), [(held_out(0.9, 0.30), 3), (held_out(0.6, 0.5), 0)])
def test_learn_says_reward_hacking_loudly_and_exits_with_its_own_status(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, after: dict[str, float], code: int
) -> None:
    import signal

    import typer

    from pipeline.cli import learn as cli
    from pipeline.learn import run
    from pipeline.learn.options import LearnOptions

    report = LearnReport({}, "right and short")
    before = {**held_out(0.05, 0.40), "n": 93, "mean_words": 19.0}
    report.evaluation = {"before": before, "after": {**after, "n": 93, "mean_words": 2.0}}
    report.verdict = run_verdict(report.evaluation)
    report.judge = {"backend": "rules"}
    monkeypatch.setattr(run, "run_learn", lambda *_: report)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # leave the test runner's handlers
    with cli.console.capture() as printed:
        try:
            cli.run_and_report(LearnOptions(workdir=tmp_path), "run")
            exit_code = 0
        except typer.Exit as exc:
            exit_code = exc.exit_code
    out = printed.get()
    assert exit_code == code == (cli.EXIT_REWARD_HACKING if code else 0)
    assert ("REWARD HACKING" in out) == bool(code)
    assert "success / accuracy" in out and "rules" in out
    assert ("reward hacking" if code else "goals met") in out
