from __future__ import annotations

import urllib.request
from pathlib import Path

import orjson
from prometheus_client import REGISTRY

from pipeline.broker.local import free_port_pair
from pipeline.training.metrics import MetricsSink


def test_step_metrics_reach_prometheus_and_the_jsonl(tmp_path: Path) -> None:
    port = free_port_pair()
    labels = {"reason": "duplicate"}
    # the counter is process-wide: other trainers in this test session may have counted
    before = REGISTRY.get_sample_value("turnstream_trainer_samples_skipped_total", labels) or 0
    sink = MetricsSink(str(tmp_path / "m.jsonl"), port, None)
    sink.record(
        {
            "step": 1,
            "loss": 0.5,
            "reward_mean": 0.25,
            "staleness": 1.0,
            "train_rollout_logprob_abs_diff": None,
            "skipped": {"duplicate": 2},
        }
    )
    sink.record(
        {
            "step": 2,
            "loss": 0.125,
            "reward_mean": 0.5,
            "staleness": 0.0,
            "skipped": {"duplicate": 3, "stale": 1},
        }
    )
    assert REGISTRY.get_sample_value("turnstream_trainer_loss") == 0.125
    assert REGISTRY.get_sample_value("turnstream_trainer_step") == 2
    skipped = REGISTRY.get_sample_value("turnstream_trainer_samples_skipped_total", labels)
    assert skipped == before + 3  # the sink adds each step's increase, not its total
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "turnstream_trainer_reward_mean 0.5" in text
    rows = [orjson.loads(x) for x in (tmp_path / "m.jsonl").read_bytes().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
