"""`turnstream learn` for a few steps with the real SmolLM2-135M-Instruct: served turns carry
the version that served them, the trainer's pushes land, and the serving engine's log-probs
are the trainer's at the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.events import Sample, decode_as
from pipeline.settings import Settings
from tests.kafka.helpers import read_all, turnstream

pytestmark = pytest.mark.model


def test_a_short_live_loop_trains_pushes_and_serves_the_new_versions(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, smollm2: Path
) -> None:
    workdir = tmp_path / "learn"
    result = turnstream(
        "learn", "--steps", "2", "--batch-size", "4", "--micro-batch-size", "4",
        "--users", "4", "--max-ahead", "4", "--max-tokens", "16", "--eval-prompts", "4",
        "--control-sessions", "4", "--workdir", str(workdir),
        env=cli_env, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((workdir / "learn.json").read_text())
    assert [p["version"] for p in report["pushes"]] == [1, 2]
    assert report["eval"]["before"]["versions"] == {"0": 4}
    assert report["eval"]["after"]["versions"] == {"2": 4}  # the last push is what is served
    assert report["eval"]["control"]["versions"] == {"0": 4}  # learning off: initial weights
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
    alignment = report["alignment"]
    assert alignment["tokens"] >= 16 and alignment["within_bounds"], alignment
    assert alignment["mean_abs_diff"] <= 1e-4 and alignment["max_abs_diff"] <= 1e-3
    assert report["freshness"]["samples"] >= 1 and report["freshness"]["p50_s"] > 0
    assert (workdir / "learn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "final - control" in result.stdout
