"""What the Kafka benchmarks share: a broker to run against and where results go."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from pipeline.broker.cluster import LocalCluster
from pipeline.broker.following import log_ends
from pipeline.broker.local import LocalKafka, free_ports
from pipeline.broker.reading import read_to_end
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings, load_settings

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def spawn(
    args: list[str], env: dict[str, str], log: Path, wrap: list[str] | None = None
) -> subprocess.Popen:
    """``python -m ARGS`` in its own process group, output to ``log``.

    ``wrap`` is a command put in front (a profiler such as ``py-spy record ... --``).
    """
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*(wrap or []), sys.executable, "-m", *args],
            env={**env, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that points a `turnstream` command at ``settings``' broker, topic
    prefix and topics profile."""
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix,
        "PYTHONPATH": str(REPO),
        **extra,
    }
    if settings.topics_profile:
        env["TURNSTREAM_TOPICS_PROFILE"] = settings.topics_profile
    return env


def spawn_worker(
    settings: Settings,
    judge_url: str,
    data_dir: Path,
    log: Path,
    concurrency: int,
    wrap: list[str] | None = None,
) -> subprocess.Popen:
    """A `turnstream worker` on ``settings``' broker and topic prefix, judging at ``judge_url``."""
    env = cli_env(settings, TURNSTREAM_SCORING_JUDGE_CONCURRENCY=str(concurrency))
    args = ["pipeline.cli", "worker", "--judge", "sglang", "--judge-url", judge_url,
            "--web-port", "0", "--data-dir", str(data_dir), "--loglevel", "warn"]  # fmt: skip
    return spawn(args, env, log, wrap)


def produce_file(settings: Settings, path: Path) -> None:
    """`turnstream produce PATH` to ``settings``' broker and topic prefix; exits on failure."""
    env = cli_env(settings)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", str(path)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"turnstream produce {path} failed:\n{done.stderr[-2000:]}")


def stop(proc: subprocess.Popen, wrapped: bool = False) -> None:
    """SIGTERM to the process group; ``wrapped``: to the wrapped command first, so
    the wrapper (a profiler) sees it exit and writes its output."""
    if wrapped and proc.poll() is None:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{url} did not answer within 60s")


def sim_stats(url: str) -> dict:
    """The judge simulator's counters (calls, busy_slot_seconds, ...)."""
    return json.loads(urllib.request.urlopen(url + "/sim/stats", timeout=10).read())


class StatsSampler:
    """Polls the simulator's counters in a thread: ``(monotonic time, stats)`` samples.

    ``steady`` takes the rate and slot utilisation between the moments the run
    reached ``lo`` and ``hi`` of its calls, leaving out the ramp-up and the drain.
    """

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        self.url, self.every_s = url, every_s
        self.samples: list[tuple[float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), sim_stats(self.url)))
            self._stop.wait(self.every_s)

    def __enter__(self) -> StatsSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic(), sim_stats(self.url)))

    def steady(self, slots: int, lo: float = 0.1, hi: float = 0.9) -> tuple[float, float]:
        first, last = self.samples[0][1]["calls"], self.samples[-1][1]["calls"]
        total = last - first

        def at(fraction: float) -> tuple[float, dict]:
            return next(s for s in self.samples if s[1]["calls"] - first >= fraction * total)

        (t0, a), (t1, b) = at(lo), at(hi)
        if t1 <= t0:
            return 0.0, 0.0
        seconds = t1 - t0
        calls = b["calls"] - a["calls"]
        busy = b["busy_slot_seconds"] - a["busy_slot_seconds"]
        return calls / seconds, busy / (seconds * slots)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def read_all(settings: Settings, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its current end, all partitions, in offset order."""
    records = read_to_end(settings, topic, timeout_s=120)
    return sorted(records, key=lambda r: (r.partition, r.offset))


def partition_ends(settings: Settings, topic: str) -> dict[int, int]:
    return {p: end for (_topic, p), end in log_ends(settings, [topic]).items()}


@contextmanager
def broker(tmp: Path, brokers: int = 1) -> Iterator[Settings]:
    """The configured cluster, or a fresh local broker in ``tmp`` (stopped afterwards);
    ``brokers=3``: a fresh local three-broker cluster, with topics of the cluster profile."""
    settings = load_settings()
    if not settings.uses_local_broker:
        yield settings
        return
    local_settings = LocalKafkaSettings(port=free_ports(2 * brokers), data_dir=tmp / "kafka")
    local: LocalKafka | LocalCluster = (
        LocalKafka(local_settings) if brokers == 1 else LocalCluster(local_settings, brokers)
    )
    try:
        local.start()
        yield Settings(
            kafka=KafkaSettings(bootstrap_servers=local.bootstrap),
            topics_profile=None if brokers == 1 else "cluster",
        )
    finally:
        local.stop()


def private_topics(base: Settings, prefix: str) -> tuple[Settings, dict[str, str]]:
    """``base`` with topics of their own under ``prefix`` + a random tag (applied), and the
    environment that points a `turnstream` command at them."""
    settings = base.model_copy(update={"topic_prefix": f"{prefix}{os.urandom(3).hex()}."})
    from pipeline.topics import admin

    admin.apply(settings)
    return settings, cli_env(settings)


def write_result(name: str, result: dict) -> dict:
    """Add the machine and commit to ``result`` and write results/NAME.json."""
    result.update(
        cores=os.cpu_count(),
        python=platform.python_version(),
        commit=subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
