"""`turnstream demo`: the whole pipeline on this machine, with live counts per stage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from kafka import KafkaConsumer, TopicPartition
from rich.console import Console
from rich.live import Live
from rich.table import Table

from pipeline.broker.clients import consumer_config
from pipeline.broker.local import LocalKafka
from pipeline.errors import TurnstreamError
from pipeline.events import Sample, decode_as
from pipeline.produce import TurnProducer, produce_file
from pipeline.settings import Settings, shipped_file
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets, group_lag


@dataclass
class DemoReport:
    sent: int = 0
    added: dict[str, int] = field(default_factory=dict)  # records added per topic this run
    scores: Counter[str] = field(default_factory=Counter)
    excluded: Counter[str] = field(default_factory=Counter)
    steps: list[dict[str, Any]] = field(default_factory=list)  # trainer metrics this run


def describe_judge(settings: Settings) -> str:
    s = settings.scoring
    if s.judge == "rules" or not s.judge_urls:
        return "rules (a deterministic heuristic judge: no judge URL is configured)"
    return f"{s.judge} at {', '.join(s.judge_urls)}"


def start_worker(settings: Settings, data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    judge = settings.scoring.judge if settings.scoring.judge_urls else "rules"
    args = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "worker",
        "--judge",
        judge,
        "--web-port",
        "0",
        "--data-dir",
        str(data_dir),
        "--loglevel",
        "warn",
    ]
    for url in settings.scoring.judge_urls if judge != "rules" else []:
        args += ["--judge-url", url]
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix,
    }
    with open(log, "wb") as out:
        return subprocess.Popen(
            args,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def progress_table(settings: Settings, before: dict[str, int], now: dict[str, int]) -> Table:
    table = Table(title="records per stage (this run)")
    table.add_column("stage")
    table.add_column("topic")
    table.add_column("this run", justify="right")
    table.add_column("total", justify="right")
    stages = {
        "chat.turns": "turns in",
        "turns.paired": "paired",
        "samples.scored": "scored",
        "samples.retry": "retry (judge unreachable)",
        "pipeline.deadletter": "dead letters",
        "policy.versions": "policy versions",
    }
    for spec in settings.topics:
        table.add_row(
            stages.get(spec.logical, spec.logical),
            spec.name,
            str(now[spec.name] - before[spec.name]),
            str(now[spec.name]),
        )
    return table


def read_samples(settings: Settings, start: dict[int, int]) -> list[Sample]:
    """The samples this run added (from the offsets recorded before it)."""
    topic = settings.topics.samples_scored.name
    consumer = KafkaConsumer(**consumer_config(settings, group_id=None))
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start.get(tp.partition, 0))
        ends = consumer.end_offsets(tps)
        samples: list[Sample] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=500).values():
                samples.extend(decode_as(Sample, r.value) for r in records)
        return samples
    finally:
        consumer.close()


def partition_ends(settings: Settings, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(**consumer_config(settings, group_id=None))
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def run_demo(
    settings: Settings,
    sessions: Path,
    workdir: Path,
    console: Console,
    keep_broker: bool = False,
    timeout_s: float = 300.0,
) -> DemoReport:
    """Broker (if local) → topics → scoring worker → example sessions → wait → summary."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = DemoReport()
    with ExitStack() as cleanup:
        if settings.uses_local_broker:
            local = LocalKafka(settings.local_kafka, log=console.print)
            if local.pid() is None:
                local.start()
                if not keep_broker:
                    cleanup.callback(_stop_broker, local, console)
            else:
                console.print(f"using the running local broker at {settings.bootstrap_servers}")
        else:
            console.print(f"using the cluster at {settings.bootstrap_servers}")
        changes = admin.apply(settings)
        console.print(
            f"topics: {len(changes)} change(s) applied"
            if changes
            else "topics: already match topics.yaml"
        )
        console.print(f"judge: {describe_judge(settings)}")
        names = [spec.name for spec in settings.topics]
        before = end_offsets(settings, names)
        scored_start = partition_ends(settings, settings.topics.samples_scored.name)
        worker = start_worker(settings, workdir / "worker", workdir / "worker.log")
        cleanup.callback(lambda: stop_process(worker))
        with TurnProducer(settings) as producer:
            sent = produce_file(sessions, producer, skip_invalid=True)
        report.sent = sent.sent
        console.print(f"sent {sent.sent} events from {sessions}")
        _wait_for_scoring(settings, worker, before, names, console, workdir, timeout_s)
        report.steps = train_tiny_policy(settings, workdir, console, timeout_s)
        now = end_offsets(settings, names)
        report.added = {n: now[n] - before[n] for n in names}
        for sample in read_samples(settings, scored_start):
            report.scores[f"{sample.score:+g}"] += 1
            if sample.exclude_reason:
                report.excluded[sample.exclude_reason] += 1
    return report


def train_tiny_policy(
    settings: Settings, workdir: Path, console: Console, timeout_s: float
) -> list[dict[str, Any]]:
    """Run `turnstream train` on the new samples (tiny random policy, CPU); its step metrics."""
    base = yaml.safe_load(
        shipped_file("configs/trainer-cpu-tiny.yaml", "trainer-cpu-tiny.yaml").read_text()
    )
    trainer_dir = workdir / "trainer"
    metrics = trainer_dir / "metrics.jsonl"
    config = {
        **base,
        "checkpoint_dir": str(trainer_dir / "ckpt"),
        "weights_dir": str(trainer_dir / "weights"),
        "metrics_jsonl": str(metrics),
    }
    config_path = workdir / "trainer.yaml"
    config_path.write_text(yaml.safe_dump(config))
    seen = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    console.print()  # the live table above ends without a newline on a non-terminal
    console.print("training a tiny random policy on CPU (DeepSpeed, ZeRO-1, fp32) ...")
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix,
    }
    log = workdir / "trainer.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.cli",
                "train",
                "--config",
                str(config_path),
                "--until-end",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise TurnstreamError(
            f"training did not finish within {timeout_s:.0f}s; see {log}"
        ) from exc
    finally:
        stop_process(proc)
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise TurnstreamError(f"the trainer exited with {code}:\n{tail}")
    rows = metrics.read_text().splitlines()[seen:] if metrics.exists() else []
    steps = [orjson.loads(row) for row in rows]
    table = Table(title="training steps (this run)")
    for column in ("step", "samples", "loss", "reward mean", "tokens/s"):
        table.add_column(column, justify="right")
    for row in steps:
        table.add_row(
            str(row["step"]),
            str(row["samples"]),
            f"{row['loss']:+.4f}",
            f"{row['reward_mean']:+.3f}",
            f"{row['tokens_per_s']:.0f}",
        )
    console.print(table)
    return steps


def _stop_broker(local: LocalKafka, console: Console) -> None:
    local.stop()
    console.print("stopped the local broker this demo started")


def _wait_for_scoring(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    before: dict[str, int],
    names: list[str],
    console: Console,
    workdir: Path,
    timeout_s: float,
) -> None:
    group = settings.topic_prefix + settings.scoring.group_id
    inputs = [settings.topics.chat_turns.name, settings.topics.turns_paired.name]
    deadline = time.monotonic() + timeout_s
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            now = end_offsets(settings, names)
            live.update(progress_table(settings, before, now))
            if worker.poll() is not None:
                log = (workdir / "worker.log").read_text(errors="replace")[-3000:]
                raise TurnstreamError(f"the scoring worker exited with {worker.returncode}:\n{log}")
            if group_lag(settings, group, inputs) == 0 and now[inputs[1]] > before[inputs[1]]:
                return
            if time.monotonic() > deadline:
                raise TurnstreamError(
                    f"scoring did not catch up within {timeout_s:.0f}s; "
                    f"see {workdir / 'worker.log'}"
                )
            time.sleep(1.0)
