"""`turnstream learn` for a few steps with the real SmolLM2-135M-Instruct: served turns carry
the version that served them, the trainer's pushes land, and the serving engine's log-probs
are the trainer's at the same weights."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pipeline.broker.local import free_port_pair
from pipeline.events import Sample, decode_as
from pipeline.settings import Settings
from tests.kafka.helpers import read_all, spawn, turnstream, wait_http

pytestmark = pytest.mark.model

# The score of a sample's votes, worked by hand: the value most of its valid votes hold;
# 0 on a tie or with none valid (a vote whose answer held no score is None, left out).
SCORE_OF_VOTES = {
    (): 0.0,
    (-1,): -1.0, (0,): 0.0, (1,): 1.0,
    (-1, -1): -1.0, (-1, 0): 0.0, (-1, 1): 0.0, (0, 0): 0.0, (0, 1): 0.0, (1, 1): 1.0,
    (-1, -1, -1): -1.0, (-1, -1, 0): -1.0, (-1, -1, 1): -1.0, (-1, 0, 0): 0.0,
    (-1, 0, 1): 0.0, (-1, 1, 1): 1.0, (0, 0, 0): 0.0, (0, 0, 1): 0.0, (0, 1, 1): 1.0,
    (1, 1, 1): 1.0,
}  # fmt: skip


def score_of(votes: list[int | None]) -> float:
    return SCORE_OF_VOTES[tuple(sorted(v for v in votes if v is not None))]


def test_a_short_live_loop_trains_pushes_and_serves_the_new_versions(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, smollm2: Path
) -> None:
    workdir = tmp_path / "learn"
    result = turnstream(
        "learn", "--steps", "2", "--batch-size", "4", "--micro-batch-size", "4",
        "--users", "4", "--max-ahead", "4", "--max-tokens", "16", "--eval-prompts", "4",
        "--control-sessions", "4", "--eval-every", "1", "--judge", "rules",
        "--workdir", str(workdir),
        env=cli_env, timeout=900,
    )  # fmt: skip
    report = finished(result, workdir)
    assert [p["version"] for p in report["pushes"]] == [1, 2]
    assert report["eval"]["before"]["versions"] == {"0": 4}
    assert report["eval"]["after"]["versions"] == {"2": 4}  # the last push is what is served
    assert report["eval"]["control"]["versions"] == {"0": 4}  # learning off: initial weights
    # version 1 evaluated as it landed, the users held: nothing trained on past it meanwhile
    assert list(report["eval"]["periodic"]) == ["1"]
    assert report["eval"]["periodic"]["1"]["versions"] == {"1": 4}
    for e in (*(report["eval"][k] for k in ("before", "after", "control")),
              report["eval"]["periodic"]["1"]):  # fmt: skip
        assert e["n"] == 4 and 0 <= e["success"] <= e["accuracy"] <= 1, e  # success is right
        assert 0 <= e["degenerate"] <= 1 and e["mean_words"] >= 0, e
    assert report["judge"]["backend"] == "rules"
    assert report["verdict"]["verdict"] in ("goals met", "goals missed", "reward hacking")
    turns = [json.loads(line) for line in (workdir / "turns.jsonl").read_text().splitlines()]
    assert {t["version"] for t in turns} >= {0, 1}  # users got version 1 after its push
    run = settings.model_copy(update={"topic_prefix": report["topic_prefix"]})
    samples = {
        s.sample_id: s
        for s in (decode_as(Sample, r.value) for r in read_all(run, run.topics.samples_scored.name))
    }
    for t in turns:
        sample = samples.get(f"{t['session_id']}:0")
        if sample is not None:  # scored before the run stopped: it carries the serving version
            assert sample.policy_version == t["version"], t
            assert sample.score == (1.0 if t["met"] else -1.0)
    assert report["training"]["steps"] == 2 and report["training"]["samples_trained"] == 8
    assert_evaluations_published(report, read_all(run, run.topics.policy_versions.name))
    alignment = report["alignment"]
    assert alignment["tokens"] >= 16 and alignment["within_bounds"], alignment
    assert alignment["mean_abs_diff"] <= 1e-4 and alignment["max_abs_diff"] <= 1e-3
    assert report["freshness"]["samples"] >= 1 and report["freshness"]["p50_s"] > 0
    assert (workdir / "learn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "final - control" in result.stdout
    assert_sentinels(report, result.stdout)


def assert_evaluations_published(report: dict, records: list) -> None:
    """policy.versions holds the trainer's two pushes and, beside them, learn's held-out
    evaluations of versions 0, 1 and 2 (not the control's), with the figures of learn.json."""
    values = [json.loads(r.value) for r in records]
    pushes = [v for v in values if "kind" not in v]
    evaluations = [v for v in values if v.get("kind") == "evaluation"]
    assert len(values) == len(pushes) + len(evaluations)
    assert [p["version"] for p in pushes] == [1, 2]
    assert [(e["version"], e["label"]) for e in evaluations] == [
        (0, "before"), (1, "version 1"), (2, "after"),
    ]  # fmt: skip
    by_label = {"before": report["eval"]["before"], "after": report["eval"]["after"],
                "version 1": report["eval"]["periodic"]["1"]}  # fmt: skip
    for e in evaluations:
        figures = by_label[e["label"]]
        assert e["heldout_accuracy"] == figures["accuracy"] and e["n"] == figures["n"] == 4
        assert e["heldout_success"] == figures["success"], (e, figures)
        assert e["degenerate"] == figures["degenerate"], (e, figures)
    assert report["published_evaluations"] == 3


def assert_sentinels(report: dict, stdout: str) -> None:
    """Per version: the trainer's figures of the step that started from it (none started
    from the last), the held-out accuracy where it was evaluated (each one, here); the KL to
    the initial policy from the top-layer reference: 0 at version 0, more once it moved.
    The output went to a pipe: progress lines, not a live table."""
    rows = report["sentinels"]["per_version"]
    assert [r["version"] for r in rows] == [0, 1, 2]
    assert all(r["heldout_accuracy"] is not None for r in rows)
    for row in rows[:2]:
        assert row["reward_mean"] is not None and row["entropy"] > 0, row
        assert row["response_length"] > 0, row
    assert abs(rows[0]["kl"]) < 1e-6, rows
    # step 1 moved the policy unless its scores were all alike (the step's mean baseline
    # leaves no advantage; the rules judge scores +1 or -1)
    assert rows[1]["kl"] > 0 or abs(rows[0]["reward_mean"]) == 1.0, rows
    assert rows[2]["reward_mean"] is None
    assert report["verdict"]["divergence"] == report["sentinels"]["divergence"]
    assert re.search(r"^learning \d+s: serving v\d, steps \d/2, turns \d+", stdout, re.M), stdout
    assert "divergence" in stdout  # the summary's row: none, or each one


@pytest.fixture
def judge_simulator(tmp_path: Path) -> Iterator[str]:
    """The judge simulator (a test double), as an OpenAI-compatible judge URL."""
    port = free_port_pair()
    proc = spawn(["pipeline.testing.judge_sim", "--port", str(port)], tmp_path / "sim.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def finished(result: subprocess.CompletedProcess[str], workdir: Path) -> dict:
    """learn.json of a run that finished: exit status 0, or 3 with the verdict "reward
    hacking" (an evaluation of 2 or 4 sampled answers moves by a quarter or more at random)."""
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert (workdir / "learn.json").exists(), output
    report = json.loads((workdir / "learn.json").read_text())
    hacked = report["verdict"]["verdict"] == "reward hacking"
    assert result.returncode == (3 if hacked else 0), output
    assert ("REWARD HACKING" in result.stdout) == hacked, output
    return report


def short_learn_run(cli_env: dict[str, str], workdir: Path, *judge: str) -> tuple[str, dict]:
    """One trainer step with an LLM judge; learn.json and what the run printed."""
    result = turnstream(
        "learn", "--steps", "1", "--batch-size", "2", "--micro-batch-size", "2",
        "--users", "2", "--max-tokens", "16", "--eval-prompts", "2", "--no-control",
        "--workdir", str(workdir), *judge,
        env=cli_env, timeout=900,
    )  # fmt: skip
    return result.stdout, finished(result, workdir)


def judged_samples(settings: Settings, report: dict) -> list[Sample]:
    run = settings.model_copy(update={"topic_prefix": report["topic_prefix"]})
    records = read_all(run, run.topics.samples_scored.name)
    return [s for s in (decode_as(Sample, r.value) for r in records) if s.next_state is not None]


def test_a_live_loop_judged_by_an_llm_judge_url(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, judge_simulator: str
) -> None:
    """``--judge URL``: the worker asks that OpenAI-compatible judge about each user reply,
    m=3 votes a sample, and the trainer trains on its scores."""
    out, report = short_learn_run(cli_env, tmp_path / "learn", "--judge", judge_simulator + "/v1")
    judge = report["judge"]
    assert judge["backend"] == "openai" and judge["urls"] == [judge_simulator], judge
    assert judge["samples_judged"] >= 1 and judge["votes"] == 3 * judge["samples_judged"]
    assert judge["failed_votes"] == 0 and "judge votes (openai)" in out
    asked = httpx.get(judge_simulator + "/sim/requests").json()
    judged = judged_samples(settings, report)
    assert judged and len(asked) >= len(judged)
    for sample in judged:
        assert sample.judge.backend == "openai" and len(sample.votes) == 3, sample
        assert sample.score == score_of(sample.votes)
        reply = sample.next_state.content  # what the simulated user said back: the evidence
        assert any(reply in str(a["body"]["messages"]) for a in asked), reply
    assert report["training"]["steps"] == 1 and [p["version"] for p in report["pushes"]] == [1]


def test_a_live_loop_judged_by_the_embedded_judge(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, smollm2: Path
) -> None:
    """``--judge embedded``: a second server of the initial weights judges through SGLang's
    /generate (its chat template renders the prompt); votes are cut at --judge-max-tokens.
    A 135M model rarely answers with a \\boxed{} score: the run says so."""
    out, report = short_learn_run(
        cli_env, tmp_path / "learn", "--judge", "embedded", "--judge-max-tokens", "8"
    )
    judge = report["judge"]
    assert judge["backend"] == "sglang" and len(judge["urls"]) == 1, judge
    assert judge["samples_judged"] >= 1 and judge["votes"] == 3 * judge["samples_judged"]
    assert (tmp_path / "learn" / "judge.log").exists()
    for sample in judged_samples(settings, report):
        assert sample.judge.backend == "sglang" and sample.judge.urls == judge["urls"]
        assert len(sample.votes) == 3 and sample.score == score_of(sample.votes)
    if judge["failed_votes"] * 2 > judge["votes"]:
        assert "judge votes gave no" in out
    assert report["training"]["steps"] == 1 and [p["version"] for p in report["pushes"]] == [1]
