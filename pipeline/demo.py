"""`turnstream demo --recorded`: the pipeline on recorded sessions, with live progress per stage.

(The live demo, `turnstream demo` without `--recorded`, is `turnstream learn` without its
control run: see :mod:`pipeline.learn.run`.)

Broker (started if none is configured) → topics → a scoring worker and a
trainer (a tiny random policy on CPU) side by side → the shipped example
sessions → live counts → a summary table and a PNG chart. Everything the demo
started is stopped on the way out, normally or on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from pipeline.broker.cluster import LocalCluster, local_broker
from pipeline.broker.following import Follower, Partition, log_ends
from pipeline.broker.local import LocalKafka
from pipeline.errors import TurnstreamError
from pipeline.events import Sample, decode_as
from pipeline.processes import Children, spawn_cli, tail
from pipeline.produce import produce_file
from pipeline.settings import Settings, shipped_file
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets, group_lag

STAGES = {
    "chat.turns": "turns in",
    "turns.paired": "paired",
    "samples.scored": "scored",
    "samples.retry": "retry (judge unreachable)",
    "pipeline.deadletter": "dead letters",
    "policy.versions": "policy versions",
    "rollout.tasks": "rollout tasks",
    "reviews": "human reviews",
}


@dataclass
class DemoReport:
    sent: int = 0
    added: dict[str, int] = field(default_factory=dict)  # records added per topic this run
    scores: Counter[str] = field(default_factory=Counter)
    excluded: Counter[str] = field(default_factory=Counter)
    votes: Counter[str] = field(default_factory=Counter)
    steps: list[dict[str, Any]] = field(default_factory=list)  # trainer metrics this run
    chart: Path | None = None


def describe_judge(settings: Settings) -> str:
    s = settings.scoring
    if s.judge == "rules" or not s.judge_urls:
        return "rules (a deterministic heuristic judge: no judge URL is configured)"
    return f"{s.judge} at {', '.join(s.judge_urls)}"


def _child_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix,
    }


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return spawn_cli(args, env, log)


def start_worker(settings: Settings, data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    judge = settings.scoring.judge if settings.scoring.judge_urls else "rules"
    args = ["worker", "--judge", judge, "--web-port", "0", "--data-dir", str(data_dir)]
    for url in settings.scoring.judge_urls if judge != "rules" else []:
        args += ["--judge-url", url]
    return _spawn([*args, "--loglevel", "warn"], _child_env(settings), log)


def start_trainer(settings: Settings, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`turnstream train` on a tiny random policy (CPU); returns it and its metrics file."""
    base = yaml.safe_load(
        shipped_file("configs/trainer-cpu-tiny.yaml", "trainer-cpu-tiny.yaml").read_text()
    )
    trainer_dir = workdir / "trainer"  # run again, it carries on (and skips what it trained)
    trainer_dir.mkdir(parents=True, exist_ok=True)
    metrics = trainer_dir / "metrics.jsonl"
    config = {
        **base,
        "checkpoint_dir": str(trainer_dir / "ckpt"),
        "weights_dir": str(trainer_dir / "weights"),
        "metrics_jsonl": str(metrics),
    }
    config_path = workdir / "trainer.yaml"
    config_path.write_text(yaml.safe_dump(config))
    proc = _spawn(
        ["train", "--config", str(config_path)], _child_env(settings), workdir / "trainer.log"
    )
    return proc, metrics


class Watch:
    """What this run added so far: samples (by score, exclusion, vote) and training steps."""

    def __init__(
        self, settings: Settings, scored_start: dict[Partition, int], metrics: Path
    ) -> None:
        self.follower = Follower(settings, [settings.topics.samples_scored.name], scored_start)
        self.metrics = metrics
        self._metrics_seen = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        self.samples: dict[str, Sample] = {}  # by sample_id: a redelivery counts once
        self.steps: list[dict[str, Any]] = []

    def poll(self) -> None:
        for record in self.follower.poll(timeout_ms=200):
            sample = decode_as(Sample, record.value)
            self.samples[sample.sample_id] = sample
        if self.metrics.exists():
            data = self.metrics.read_bytes()  # once: the trainer may be appending
            rows = data.decode(errors="replace").splitlines()
            complete = rows if data.endswith(b"\n") else rows[:-1]
            for row in complete[self._metrics_seen :]:
                self.steps.append(orjson.loads(row))
            self._metrics_seen = max(self._metrics_seen, len(complete))

    def fill(self, report: DemoReport) -> None:
        report.scores = Counter(f"{s.score:+g}" for s in self.samples.values())
        report.excluded = Counter(
            s.exclude_reason for s in self.samples.values() if s.exclude_reason
        )
        report.votes = Counter(
            "failed" if v is None else f"{v:+d}" for s in self.samples.values() for v in s.votes
        )
        report.steps = list(self.steps)

    def close(self) -> None:
        self.follower.close()


def progress_view(
    settings: Settings,
    before: dict[str, int],
    now: dict[str, int],
    watch: Watch,
    phase: str,
) -> Group:
    stages = Table(title="records per stage (this run)")
    stages.add_column("stage")
    stages.add_column("topic")
    stages.add_column("this run", justify="right")
    stages.add_column("total", justify="right")
    for spec in settings.topics:
        stages.add_row(
            STAGES.get(spec.logical, spec.logical),
            spec.name,
            str(now[spec.name] - before[spec.name]),
            str(now[spec.name]),
        )
    report = DemoReport()
    watch.fill(report)
    detail = Table(title=f"scoring and training ({phase})")
    detail.add_column("what")
    detail.add_column("count / value", justify="right")
    for score in ("+1", "+0", "-1"):
        detail.add_row(f"scored {score.replace('+0', '0')}", str(report.scores.get(score, 0)))
    for reason, n in sorted(report.excluded.items()):
        detail.add_row(f"excluded: {reason}", str(n))
    retries = now[settings.topics.samples_retry.name] - before[settings.topics.samples_retry.name]
    detail.add_row("retries (judge unreachable)", str(retries))
    detail.add_row("training steps", str(len(report.steps)))
    if report.steps:
        last = report.steps[-1]
        detail.add_row("last loss", f"{last['loss']:+.4f}")
        detail.add_row("last reward mean", f"{last['reward_mean']:+.3f}")
    return Group(stages, detail)


def write_chart(report: DemoReport, path: Path) -> Path:
    """Reward mean and loss per training step, and judge votes per value, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward_ax, loss_ax, votes_ax) = plt.subplots(1, 3, figsize=(13, 3.8))
    steps = [row["step"] for row in report.steps]
    if steps:
        reward_ax.plot(steps, [row["reward_mean"] for row in report.steps], marker="o")
        loss_ax.plot(steps, [row["loss"] for row in report.steps], marker="o", color="tab:red")
    else:
        for ax in (reward_ax, loss_ax):
            ax.text(0.5, 0.5, "no training steps", ha="center", va="center")
    reward_ax.set(title="reward mean per step", xlabel="step", ylabel="mean score")
    loss_ax.set(title="loss per step", xlabel="step", ylabel="loss")
    labels = ["-1", "+0", "+1", "failed"]
    counts = [report.votes.get(label, 0) for label in labels]
    votes_ax.bar(
        ["-1", "0", "+1", "failed"],
        counts,
        color=["tab:red", "tab:gray", "tab:green", "tab:orange"],
    )
    votes_ax.set(title="judge votes per value", ylabel="votes")
    fig.suptitle("turnstream demo")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_demo(
    settings: Settings,
    sessions: Path,
    workdir: Path,
    console: Console,
    keep_broker: bool = False,
    timeout_s: float = 600.0,
) -> DemoReport:
    """Run the pipeline on ``sessions`` and report what each stage did."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = DemoReport()
    with ExitStack() as cleanup:
        if settings.uses_local_broker:
            local = local_broker(settings.local_kafka, log=console.print)
            if not local.running:
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
        scored_start = log_ends(settings, [settings.topics.samples_scored.name])
        children = Children()  # stopped together: one timeout, not one per process
        cleanup.callback(children.stop)
        worker = children.add(start_worker(settings, workdir / "worker", workdir / "worker.log"))
        trainer, metrics = start_trainer(settings, workdir)
        children.add(trainer)
        console.print(
            "started a scoring worker and a trainer (tiny random policy, DeepSpeed on CPU); "
            f"logs in {workdir}"
        )
        watch = Watch(settings, scored_start, metrics)
        cleanup.callback(watch.close)
        cleanup.callback(children.stop)  # on the way out, before the watch closes
        sent = produce_file(sessions, settings, skip_invalid=True)
        report.sent = sent.sent
        console.print(f"sent {sent.sent} events from {sessions}")
        _follow(settings, worker, trainer, watch, before, names, console, workdir, timeout_s)
        now = end_offsets(settings, names)
        report.added = {n: now[n] - before[n] for n in names}
        watch.poll()
        watch.fill(report)
        report.chart = write_chart(report, workdir / "demo.png")
    return report


def _follow(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    trainer: subprocess.Popen[bytes],
    watch: Watch,
    before: dict[str, int],
    names: list[str],
    console: Console,
    workdir: Path,
    timeout_s: float,
) -> None:
    """Live view until scoring caught up and the trainer trained everything, then return."""
    group = settings.topic_prefix + settings.scoring.group_id
    inputs = [settings.topics.chat_turns.name, settings.topics.turns_paired.name]
    started = time.monotonic()
    deadline = started + timeout_s
    draining = False
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            now = end_offsets(settings, names)
            watch.poll()
            phase = "training the last samples" if draining else "scoring"
            live.update(progress_view(settings, before, now, watch, phase))
            if worker.poll() is not None:
                raise TurnstreamError(
                    f"the scoring worker exited with {worker.returncode}:\n"
                    + tail(workdir / "worker.log")
                )
            code = trainer.poll()
            if code is not None and not (draining and code == 0):
                raise TurnstreamError(
                    f"the trainer exited with {code}:\n" + tail(workdir / "trainer.log")
                )
            if draining and code == 0:
                watch.poll()
                live.update(progress_view(settings, before, now, watch, "done"))
                break
            if (
                not draining
                and _handles_usr1(trainer.pid, time.monotonic() - started)
                and now[inputs[1]] > before[inputs[1]]
                and group_lag(settings, group, inputs) == 0
            ):
                trainer.send_signal(signal.SIGUSR1)  # train what is scored now, then stop
                draining = True
            if time.monotonic() > deadline:
                raise TurnstreamError(
                    f"the demo did not finish within {timeout_s:.0f}s "
                    f"({'training' if draining else 'scoring'}); see the logs in {workdir}"
                )
            time.sleep(1.0)
    console.print()  # the live view ends without a newline on a non-terminal


def _handles_usr1(pid: int, waited_s: float) -> bool:
    """Whether the trainer has its SIGUSR1 handler in (SIGUSR1 would kill it before).

    Linux tells (``SigCgt`` in /proc); elsewhere, give its start-up 30 seconds.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return waited_s > 30
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return waited_s > 30


def _stop_broker(local: LocalKafka | LocalCluster, console: Console) -> None:
    local.stop()
    console.print("stopped the local broker this demo started")
