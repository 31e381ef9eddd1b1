"""The trainer's TensorBoard scalars, read back with TensorBoard's own event reader: real
steps on the tiny random policy, the same figures as its metrics.jsonl."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.errors import ConfigError
from pipeline.events import JudgeIdentity, Response, Sample, encode
from pipeline.settings import Settings
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine
from pipeline.training.metrics import MetricsSink
from pipeline.training.trainer import Trainer
from tests.broker_doubles import FlakyConsumer, OutageProducer
from tests.tiny_policy import TINY, VOCAB

TRAIN = (
    "loss", "pg_loss", "pg_clipfrac", "ppo_kl", "rollout_kl", "tis_weight_mean",
    "tis_clipfrac", "topk_kl", "teacher_gap", "entropy", "kl", "reward_mean",
    "response_length", "train_rollout_logprob_abs_diff", "staleness", "policy_version", "lr",
)  # fmt: skip
PERF = ("tokens", "tokens_per_s", "samples", "samples_per_s")
TIMES = ("wait", "train", "push", "checkpoint")
SENTINELS = ("reward_mean", "teacher_gap", "response_length", "entropy", "kl")


def record(i: int) -> SimpleNamespace:
    """Sample ``i`` on samples.scored: its rollout log-probs are not the trainer's (the
    TIS weights differ from 1), its score differs from its neighbours'."""
    response = [(3 * i + j) % VOCAB for j in range(2 + i % 3)]
    sample = Sample(
        sample_id=f"s:{i}",
        session_id="s",
        turn_index=i,
        messages=[],
        response=Response(content="x"),
        next_state=None,
        prompt_ids=[(7 * i + j) % VOCAB for j in range(4 + i % 2)],
        response_ids=response,
        response_logprobs=[-4.0 + 0.3 * j for j in range(len(response))],
        score=[1.0, -1.0, 0.5, -0.5][i % 4] * (1 + i % 3),
        votes=[1],
        judge_calls=1,
        exclude_reason=None,
        loss_mask=1,
        mode="rl",
        policy_version=0,
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
    )
    return SimpleNamespace(value=encode(sample), topic="samples.scored", partition=0, offset=i)


def trainer(tmp_path: Path) -> Trainer:
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        weights_dir=str(tmp_path / "weights"),
        metrics_jsonl=str(tmp_path / "metrics.jsonl"),
        tensorboard_dir=str(tmp_path / "tb"),
        rollout_batch_size=4,
        micro_batch_size=2,
        update_weights_interval=2,  # versions 1 and 2, at steps 2 and 4
        lr=1e-2,
        tis_clip=2.0,
        tiny_model={**TINY, "num_hidden_layers": 1},
    )
    tokenizer = SimpleNamespace(pad_token_id=0, save_pretrained=lambda _path: None)
    t = Trainer(Settings(), config, PolicyEngine(config, vocab_size=VOCAB), tokenizer)
    t.source.consumer = FlakyConsumer(failures=0)  # what open() would connect
    return t


def train(t: Trainer, records: list[SimpleNamespace], out: OutageProducer) -> None:
    """What ``Trainer._lead`` does with one poll's records, then the steps they fill."""
    for r in records:
        t.intake.accept(r, out, t.state.policy_version)  # type: ignore[arg-type]
        t.source.passed(r)
    t._steps_ready(out)  # type: ignore[arg-type]


def rows_in(jsonl: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # 0: keep all
    events.Reload()
    tags = events.Tags()["scalars"]
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in tags}


def expected(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """The tags a metrics.jsonl's rows should give, by hand: each value as TensorBoard
    stores it (a float32)."""
    out: dict[str, list[tuple[int, float]]] = {}

    def put(tag: str, step: int, value: float | None) -> None:
        if value is not None:
            out.setdefault(tag, []).append((step, float(np.float32(value))))

    for row in rows:
        for name in TRAIN:
            put(f"train/{name}", row["step"], row[name])
        for name in PERF:
            put(f"perf/{name}", row["step"], row[name])
        for part in TIMES:
            put(f"time/{part}_s", row["step"], row["time_s"][part])
        for reason, total in row["skipped"].items():
            put(f"skipped/{reason}", row["step"], total)
        if row["pushed"]:
            put("push/bytes", row["step"], row["push"]["bytes"])
            for name in SENTINELS:
                put(f"version/{name}", row["policy_version"], row[name])
    return out


def test_trainer_steps_write_the_metrics_rows_as_tensorboard_scalars(tmp_path: Path) -> None:
    t, out = trainer(tmp_path), OutageProducer()
    records = [record(i) for i in range(16)]
    records.insert(3, record(1))  # a duplicate: skipped/duplicate
    train(t, records[:9], out)
    # before close, as a running tensorboard reads them: every figure of the steps so far
    assert read_scalars(tmp_path / "tb") == expected(rows_in(tmp_path / "metrics.jsonl"))
    train(t, records[9:], out)
    t.sink.close()

    rows = rows_in(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["policy_version"] for r in rows if r["pushed"]] == [1, 2]
    numbers = {k for k, v in rows[0].items() if type(v) in (int, float)} - {"step"}
    assert numbers == set(TRAIN + PERF)  # every figure of a row has its tag
    assert len({r["reward_mean"] for r in rows}) > 1
    assert any(not math.isclose(r["tis_weight_mean"], 1.0) for r in rows)

    scalars = read_scalars(tmp_path / "tb")
    assert scalars == expected(rows)
    assert [step for step, _ in scalars["version/kl"]] == [1, 2]  # keyed by policy version
    assert [step for step, _ in scalars["perf/samples_per_s"]] == [1, 2, 3, 4]


def test_non_finite_and_missing_figures_are_skipped(tmp_path: Path) -> None:
    sink = MetricsSink(None, 0, str(tmp_path / "tb"))
    sink.record({"step": 1, "loss": math.nan, "kl": math.inf, "entropy": None, "pg_loss": 0.5})
    sink.record({"step": 2, "loss": 0.25, "pushed": False, "time_s": {"train": -math.inf}})
    sink.close()
    assert read_scalars(tmp_path / "tb") == {
        "train/loss": [(2, 0.25)],
        "train/pg_loss": [(1, 0.5)],
    }


def test_tensorboard_dir_without_the_package_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        MetricsSink(None, 0, str(tmp_path / "tb"))


def test_an_rl_step_of_alike_scores_with_alike_steps_skip_updates_nothing(tmp_path: Path) -> None:
    """alike_steps skip, step baseline mean, rl: step 1's four samples all scored -1 and
    leave every weight as it was (its row says updated false), step 2's differ and train."""
    import dataclasses

    import torch

    t, out = trainer(tmp_path), OutageProducer()
    t.config = dataclasses.replace(t.config, step_baseline="mean", alike_steps="skip")
    records = [record(i) for i in range(8)]
    for r in records[:4]:
        sample = orjson.loads(r.value)
        r.value = orjson.dumps({**sample, "score": -1.0})
    params = [p for p in t.engine.engine.module.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    train(t, records[:4], out)
    assert all(torch.equal(b, p.detach()) for b, p in zip(before, params, strict=True))
    train(t, records[4:], out)
    assert not all(torch.equal(b, p.detach()) for b, p in zip(before, params, strict=True))
    t.sink.close()
    rows = rows_in(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["updated"], r["reward_mean"]) for r in rows[:1]] == [(1, False, -1.0)]
    assert rows[1]["updated"] is True and rows[1]["step"] == 2
