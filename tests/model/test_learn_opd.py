"""`turnstream learn --mode opd` for two steps with the real SmolLM2-135M-Instruct: the rules
judge's hints (the users' corrections) are taught by the served policy itself, and only the
hinted turns train, each with the teacher's log-probs of exactly its response tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.events import Sample, decode_as
from pipeline.judge.teacher import PolicyTokenizer
from pipeline.settings import Settings
from pipeline.training.batch import tokenize_sample
from tests.kafka.helpers import read_all, turnstream

pytestmark = [pytest.mark.model, pytest.mark.kafka]


def test_a_short_opd_loop_trains_hinted_turns_on_the_served_policys_teacher_logprobs(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, smollm2: Path
) -> None:
    workdir = tmp_path / "learn"
    result = turnstream(
        "learn", "--mode", "opd", "--steps", "2", "--batch-size", "4", "--micro-batch-size", "4",
        "--users", "4", "--max-tokens", "16", "--eval-prompts", "2", "--eval-every", "0",
        "--no-control", "--judge", "rules", "--workdir", str(workdir),
        env=cli_env, timeout=900,
    )  # fmt: skip
    output = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode in (0, 3) and (workdir / "learn.json").exists(), output
    report = json.loads((workdir / "learn.json").read_text())
    assert (report["options"]["mode"], report["options"]["baseline"]) == ("opd", "none")
    assert "mode" in result.stdout and "opd" in result.stdout
    assert [p["version"] for p in report["pushes"]] == [1, 2]
    assert report["training"]["steps"] == 2 and report["training"]["samples_trained"] == 8
    teacher = report["training"]["teacher"]
    assert teacher["trained_with_teacher"] == 8 and teacher["trained_without_teacher"] == 0
    assert teacher["samples_with_teacher"] >= 8, teacher

    run = settings.model_copy(update={"topic_prefix": report["topic_prefix"]})
    samples = {
        s.sample_id: s
        for s in (decode_as(Sample, r.value) for r in read_all(run, run.topics.samples_scored.name))
    }
    ledger = (workdir / "trainer" / "ledger.tsv").read_text().splitlines()
    trained = [samples[line.split("\t", 1)[1]] for line in ledger]
    assert len(trained) == 8
    tok = PolicyTokenizer(smollm2).tok
    gaps = []
    for sample in trained:
        assert sample.mode == "opd" and sample.loss_mask == 1, sample.sample_id
        assert sample.hint and sample.hint.startswith("The user said afterwards: ")
        assert sample.hint.endswith(sample.next_state.content.strip()[:300])  # type: ignore[union-attr]
        tokens = tokenize_sample(sample, tok, max_seq_len=512)
        assert not tokens.teacher_misaligned and tokens.teacher_logprobs is not None
        assert tokens.teacher_logprobs == sample.teacher_logprobs  # every response token, EOT too
        assert all(lp <= 0 for lp in tokens.teacher_logprobs)
        rollout = sample.response_logprobs or []
        gaps += [abs(t - r) for t, r in zip(tokens.teacher_logprobs, rollout, strict=False)]
    # the hinted prompt is another distribution than the one the answer was sampled from
    assert gaps and sum(gaps) / len(gaps) > 1e-2
    for sample in samples.values():  # a thanks gives no hint: dropped, the teacher not asked
        if sample.exclude_reason == "no_hint":
            assert sample.teacher_logprobs is None and sample.hint is None
