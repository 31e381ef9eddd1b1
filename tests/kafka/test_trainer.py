"""The trainer consumer on the real broker: exactly once per sample_id, weight push."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from pipeline.broker.local import free_port_pair
from pipeline.events import DeadLetter, JudgeIdentity, Response, Sample, decode_as, encode
from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.topics.offsets import group_lag
from tests.kafka.helpers import read_all, spawn, turnstream


def sample(i: int, mask: int = 1, reason: str | None = None, ids: bool = False) -> Sample:
    return Sample(
        sample_id=f"sess-{i % 3}:{i}",
        session_id=f"sess-{i % 3}",
        turn_index=i,
        messages=[{"role": "user", "content": f"question number {i}"}],  # type: ignore[list-item]
        response=Response(content=f"answer {i} with some words"),
        next_state=None,
        prompt_ids=list(range(5, 12)) if ids else None,
        response_ids=[20, 21, 22] if ids else None,
        response_logprobs=[-1.0, -1.2, -0.8] if ids else None,
        score=1.0 if i % 2 else -1.0,
        votes=[1],
        judge_calls=1,
        exclude_reason=reason,  # type: ignore[arg-type]
        loss_mask=mask,
        mode="rl",
        policy_version=0,
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
    )


def publish(settings: Settings, samples: list[Sample]) -> None:
    raw = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for s in samples:
        raw.send(settings.topics.samples_scored.name, key=s.session_id.encode(), value=encode(s))
    raw.flush()
    raw.close()


def assert_trained_once(settings: Settings, ledger: Path, samples: list[Sample]) -> None:
    """Every sample_id trained exactly once, none skipped, all offsets committed."""
    trained = [line.split("\t")[1] for line in ledger.read_text().splitlines()]
    assert sorted(trained) == sorted(s.sample_id for s in samples)
    group = settings.topic_prefix + "turnstream-trainer"
    assert group_lag(settings, group, [settings.topics.samples_scored.name]) == 0


def train_args(config: Path, ledger: Path) -> list[str]:
    return ["train", "--config", str(config), "--until-end", "--ledger", str(ledger)]


def write_config(tmp_path: Path, policy_url: str | None) -> Path:
    """A CPU trainer config; with no policy_url, no weights are pushed."""
    config = {
        "mode": "rl",
        "rollout_batch_size": 4,
        "micro_batch_size": 2,
        "lr": 1e-3,
        "zero_stage": 1,
        "max_seq_len": 256,
        "tiny_model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
        },
        "checkpoint_dir": str(tmp_path / "trainer" / "ckpt"),
        "weights_dir": str(tmp_path / "trainer" / "weights"),
        "metrics_jsonl": str(tmp_path / "trainer" / "metrics.jsonl"),
        "policy_urls": [policy_url] if policy_url else [],
        "update_weights_interval": 1 if policy_url else 0,
    }
    path = tmp_path / "trainer.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_trainer_trains_each_included_sample_once_and_pushes_weights(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    included = [sample(i, ids=i % 2 == 0) for i in range(10)]
    excluded = [sample(100 + i, mask=0, reason="neutral_score") for i in range(3)]
    raw = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for s in included + excluded:
        raw.send(settings.topics.samples_scored.name, key=s.session_id.encode(), value=encode(s))
    raw.send(settings.topics.samples_scored.name, key=b"x", value=b'{"type": "sample"}')
    raw.send(settings.topics.samples_scored.name, key=b"sess-0", value=encode(included[0]))
    raw.flush()
    raw.close()

    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.policy_sim", "--port", str(port), "--fail-first", "1"],
        tmp_path / "policy.log",
    )
    url = f"http://127.0.0.1:{port}"
    _wait(url + "/health")
    config = write_config(tmp_path, url)
    ledger = tmp_path / "ledger.tsv"
    try:
        first = turnstream(
            *train_args(config, ledger),
            env=cli_env,
            timeout=600,
        )
        assert first.returncode == 0, first.stderr[-3000:]
        trained = [line.split("\t")[1] for line in ledger.read_text().splitlines()]
        assert sorted(trained) == sorted(s.sample_id for s in included)  # each exactly once
        assert "'duplicate': 1" in first.stdout and "'excluded:neutral_score': 3" in first.stdout
        # A restart resumes from the checkpoint: nothing is trained again.
        second = turnstream(
            *train_args(config, ledger),
            env=cli_env,
            timeout=600,
        )
        assert second.returncode == 0, second.stderr[-3000:]
        assert len(ledger.read_text().splitlines()) == len(included)
        updates = orjson.loads(urllib.request.urlopen(url + "/sim/updates", timeout=5).read())
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    steps = 3  # 10 samples, batches of 4: 4 + 4 + 2
    assert f"trained {steps} step(s)" in first.stdout
    assert updates["calls"] == steps + 1  # the first call was refused and retried
    assert len(updates["loaded"]) == steps
    # keep_weight_versions and keep_checkpoints (2 by default): older ones were deleted.
    assert [Path(p).exists() for p in updates["loaded"]] == [False, True, True]
    assert all(Path(p, "config.json").exists() for p in updates["loaded"][1:])
    ckpt = tmp_path / "trainer" / "ckpt"
    assert sorted(p.name for p in ckpt.glob("step*")) == ["step00000002", "step00000003"]
    versions = [
        orjson.loads(r.value) for r in read_all(settings, settings.topics.policy_versions.name)
    ]
    assert [v["version"] for v in versions] == [1, 2, 3]
    sentinels = {"reward_mean", "teacher_gap", "response_length", "entropy", "kl"}
    assert all(set(v["step_metrics"]) == sentinels for v in versions)
    assert all(v["push"]["kind"] == "full" and v["push"]["bytes"] > 0 for v in versions)
    assert all(r.key == b"policy" for r in read_all(settings, settings.topics.policy_versions.name))
    letters = [
        decode_as(DeadLetter, r.value) for r in read_all(settings, settings.topics.deadletter.name)
    ]
    assert [d.stage for d in letters] == ["train"] and "sample_id" in letters[0].error
    group = settings.topic_prefix + "turnstream-trainer"
    assert group_lag(settings, group, [settings.topics.samples_scored.name]) == 0
    rows = [
        orjson.loads(line)
        for line in (tmp_path / "trainer" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(set(r["time_s"]) == {"wait", "train", "push", "checkpoint"} for r in rows)
    assert [r["push"]["kind"] for r in rows] == ["full"] * 3  # the simulator takes no delta
    assert all(
        {
            "loss",
            "pg_loss",
            "pg_clipfrac",
            "ppo_kl",
            "entropy",
            "reward_mean",
            "tokens_per_s",
            "train_rollout_logprob_abs_diff",
        }
        <= set(r)
        for r in rows
    )


def _wait(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_kill_9_mid_training_then_restart_trains_every_sample_exactly_once(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    import os
    import signal

    admin.apply(settings)
    included = [sample(i, ids=True) for i in range(80)]
    publish(settings, included)
    config = write_config(tmp_path, policy_url=None)
    ledger = tmp_path / "ledger.tsv"
    args = ["pipeline.cli", *train_args(config, ledger)]
    proc = spawn(args, tmp_path / "train1.log", cli_env)
    deadline = time.monotonic() + 300
    while not ledger.exists() or len(ledger.read_text().splitlines()) < 12:
        assert proc.poll() is None, (tmp_path / "train1.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(ledger.read_text().splitlines())
    assert killed_at < len(included), "the trainer finished before it could be killed"

    again = turnstream(
        *train_args(config, ledger),
        env=cli_env,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert_trained_once(settings, ledger, included)


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_two_ranks_rank0_consumes_and_broadcasts(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, launcher: str
) -> None:
    admin.apply(settings)
    included = [sample(i, ids=i % 2 == 0) for i in range(9)]
    publish(settings, included)
    config = write_config(tmp_path, policy_url=None)
    ledger = tmp_path / "ledger.tsv"
    train = ["pipeline.cli", *train_args(config, ledger)]
    port = str(free_port_pair())
    if launcher == "torchrun":
        args = [
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            port,
            "-m",
            *train,
        ]
    else:  # the `deepspeed` command, on CPU ranks
        args = [
            "deepspeed.launcher.runner",
            "--num_gpus",
            "2",
            "--master_port",
            port,
            "--module",
            *train,
        ]
    proc = spawn(args, tmp_path / "ranks.log", {**cli_env, "OMP_NUM_THREADS": "1"})
    try:
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "ranks.log").read_text()
    assert code == 0, log[-4000:]
    assert log.count("trained 3 step(s)") == 2  # both ranks took the same 3 steps
    assert_trained_once(settings, ledger, included)


def test_offline_training_takes_exactly_a_range_and_repeats_its_batches(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    base = (int(time.time()) - 3600) * 1000  # recent: retention counts from timestamps
    eras = (base, base + 100_000, base + 200_000)
    raw = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    in_range = []
    for era, base in enumerate(eras):
        for i in range(era * 100, era * 100 + 18):
            s = sample(
                i, mask=0 if i % 9 == 0 else 1, reason="neutral_score" if i % 9 == 0 else None
            )
            raw.send(
                settings.topics.samples_scored.name,
                key=s.session_id.encode(),
                value=encode(s),
                timestamp_ms=base + i,
            )
            if era == 1 and s.loss_mask:
                in_range.append(s.sample_id)
    raw.flush()
    raw.close()
    ledgers = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        config = write_config(tmp_path / run, None)
        ledger = tmp_path / run / "ledger.tsv"
        result = turnstream(
            "train", "--config", str(config), "--ledger", str(ledger),
            "--from-topic", "samples.scored", "--since", str(eras[1]), "--until", str(eras[2]),
            env=cli_env, timeout=900,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert "offline training on 18 record(s)" in result.stderr
        ledgers.append(ledger.read_text())
    trained = [line.split("\t")[1] for line in ledgers[0].splitlines()]
    assert sorted(trained) == sorted(in_range)  # exactly the range's included samples
    assert ledgers[0] == ledgers[1]  # same range and seed: same batches, same order
    live = settings.topic_prefix + "turnstream-trainer"
    assert group_lag(settings, live, [settings.topics.samples_scored.name]) in (None, 54)
