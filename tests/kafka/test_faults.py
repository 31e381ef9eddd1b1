"""Soak: the broker restarts under load and the trainer is killed mid-step (make soak).

- A broker of the test's own (never the shared one) is stopped with SIGTERM, then
  killed with SIGKILL, each time while a producer, two scoring workers and the
  trainer run; it comes back on the same ports and data dir after ~12 s. No
  process is restarted by the test: every one must reconnect by itself, and
  nothing is lost or trained twice.
- The trainer is killed with SIGKILL mid-step several times and restarted: every
  included sample_id is trained exactly once, duplicates on the topic included.

Recovery times are printed (run with ``-s``). TURNSTREAM_FAULT_TURNS sizes the
broker scenario (default 2,000 turns).
"""

from __future__ import annotations

import ast
import json
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.broker.local import LocalKafka, free_port_pair
from pipeline.events import Sample, decode_as
from pipeline.produce import TurnProducer
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets, group_lag
from tests.kafka.helpers import read_all, spawn, wait_http
from tests.kafka.test_scoring_e2e import start_worker, stop
from tests.kafka.test_soak import PER_SESSION, finished
from tests.kafka.test_trainer import publish, sample, train_args, write_config

pytestmark = pytest.mark.slow

TURNS = int(os.environ.get("TURNSTREAM_FAULT_TURNS", "2000"))
DOWN_S = 12.0  # how long the broker stays down


@contextmanager
def own_broker(data_dir: Path) -> Iterator[LocalKafka]:
    """A broker for this test alone: stopping it cannot disturb other tests."""
    local = LocalKafka(
        LocalKafkaSettings(port=free_port_pair(), data_dir=data_dir, heap="512M"),
        log=lambda _msg: None,
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


def session_events(turns: int, wave: int = 50) -> tuple[list[tuple[str, bytes]], set[str], int]:
    """Sessions of PER_SESSION main turns, ``wave`` sessions at a time, each closed by a
    session_end: (events, main-turn sample ids, pairs with a next state)."""
    sessions = max(1, turns // PER_SESSION)
    events: list[tuple[str, bytes]] = []
    for first in range(0, sessions, wave):
        ids = [f"bk-{s:05d}" for s in range(first, min(first + wave, sessions))]
        for t in range(PER_SESSION):
            for sid in ids:
                turn = {"type": "turn", "session_id": sid, "turn_index": t, "turn_type": "main",
                        "ts": time.time(),
                        "messages": [{"role": "user", "content": f"step {t} of job {sid}"}],
                        "response": {"content": f"ran step {t}"}}  # fmt: skip
                events.append((sid, json.dumps(turn).encode()))
        for sid in ids:
            end = {"type": "session_end", "session_id": sid, "ts": time.time()}
            events.append((sid, json.dumps(end).encode()))
    expected = {f"bk-{s:05d}:{t}" for s in range(sessions) for t in range(PER_SESSION)}
    return events, expected, sessions * (PER_SESSION - 1)


@dataclass
class Feed:
    """Sends events through TurnProducer (the `turnstream produce` path) at a steady pace."""

    settings: Settings
    events: list[tuple[str, bytes]]
    duration_s: float
    sent: int = 0
    error: BaseException | None = None
    failed: int = 0
    thread: threading.Thread = field(init=False)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="feed", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        gap = self.duration_s / len(self.events)
        started = time.monotonic()
        try:
            with TurnProducer(self.settings) as producer:
                for i, (sid, raw) in enumerate(self.events):
                    producer.send_raw(sid, raw)
                    self.sent += 1
                    delay = started + (i + 1) * gap - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                try:
                    producer.flush(timeout_s=300)
                finally:
                    self.failed = producer.failed
        except BaseException as exc:  # reported by the test
            self.error = exc


def scored_end(settings: Settings) -> int:
    topic = settings.topics.samples_scored.name
    return end_offsets(settings, [topic])[topic]


def ledger_lines(ledger: Path) -> int:
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


def worker_scored(port: int) -> float:
    """Samples this worker has emitted so far (its own /metrics); -1 while it cannot answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
    except OSError:
        return -1.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.decode().splitlines()
        if line.startswith("turnstream_samples_scored_total{")
    )


def outage(
    local: LocalKafka,
    how: str,
    settings: Settings,
    ledger: Path,
    feed: Feed,
    alive: Callable,
    ports: list[int],
) -> dict[str, float]:
    """Take the broker down (SIGTERM or SIGKILL), restart it after DOWN_S; recovery times."""
    pid = local.pid()
    assert pid is not None
    down_at, sent = time.monotonic(), feed.sent
    if how == "SIGTERM":
        assert local.stop()
    else:
        os.kill(pid, signal.SIGKILL)
        while Path(f"/proc/{pid}").exists():
            try:
                os.waitpid(pid, 0)  # the broker is our child: reap it
            except ChildProcessError:
                time.sleep(0.1)
    while time.monotonic() - down_at < DOWN_S:
        alive()
        time.sleep(0.5)
    start_at = time.monotonic()
    local.start()  # the same ports and data dir
    up_at = time.monotonic()
    times = {"down_s": up_at - down_at, "start_s": up_at - start_at}
    times["sent_while_down"] = feed.sent - sent  # the producer kept accepting events
    scored, trained = scored_end(settings), ledger_lines(ledger)  # once it is back
    by_worker = [worker_scored(port) for port in ports]
    wanted = {"scored_s", "trained_s", *(f"w{i}_scored_s" for i in range(len(ports)))}
    deadline = up_at + 240
    while not wanted <= times.keys() and time.monotonic() < deadline:
        if "scored_s" not in times and scored_end(settings) > scored:
            times["scored_s"] = time.monotonic() - up_at
        if "trained_s" not in times and ledger_lines(ledger) > trained:
            times["trained_s"] = time.monotonic() - up_at
        for i, port in enumerate(ports):
            if f"w{i}_scored_s" not in times and worker_scored(port) > by_worker[i]:
                times[f"w{i}_scored_s"] = time.monotonic() - up_at
        alive()
        time.sleep(0.2)
    return times


def trained_ids(ledger: Path) -> list[str]:
    return [line.split("\t")[1] for line in ledger.read_text().splitlines()]


def test_broker_restarts_under_load_lose_nothing(tmp_path: Path) -> None:
    with own_broker(tmp_path / "kafka") as local:
        settings = Settings(
            kafka=KafkaSettings(bootstrap_servers=local.settings.bootstrap),
            topic_prefix="faults.",
            producer_linger_ms=0,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=local.settings.bootstrap, TURNSTREAM_TOPIC_PREFIX="faults."
        )
        admin.apply(settings)
        run_through_outages(local, settings, env, tmp_path)


def run_through_outages(
    local: LocalKafka, settings: Settings, env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "64", "--latency-ms",
         "20", "--agreement", "1.0"],
        tmp_path / "sim.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    events, expected, judged = session_events(TURNS)
    ledger = tmp_path / "ledger.tsv"
    config = write_config(tmp_path, policy_url=None)
    procs: list[subprocess.Popen] = []
    try:
        wait_http(url + "/health", sim)
        ports = [free_port_pair() for _ in range(2)]
        procs = [
            start_worker(env, url, tmp_path / f"w{i}", tmp_path / f"w{i}.log", ports[i])
            for i in range(2)
        ]
        trainer = spawn(
            ["pipeline.cli", "train", "--config", str(config), "--ledger", str(ledger)],
            tmp_path / "train.log",
            env,
        )
        procs.append(trainer)
        feed = Feed(settings, events, duration_s=150)
        started = time.monotonic()
        feed.start()
        recoveries = {}
        # the first outage once all of it is moving; the second by the feed's progress (the
        # first one's recovery waited for training to resume), so the producer is sending
        # through both
        for how, share in (("SIGTERM", 0.0), ("SIGKILL", 0.6)):
            while ledger_lines(ledger) < 20 or feed.sent < share * len(events):
                assert_alive(procs, tmp_path)
                assert time.monotonic() - started < 300, "no training before the outage"
                time.sleep(0.5)
            recoveries[how] = outage(
                local, how, settings, ledger, feed, lambda: assert_alive(procs, tmp_path), ports
            )
            assert_alive(procs, tmp_path)
        feed.thread.join(timeout=400)
        assert feed.error is None and feed.failed == 0, (feed.error, feed.failed)
        assert feed.sent == len(events)
        missing = wait_finished(settings, expected, procs, tmp_path)
        os.killpg(trainer.pid, signal.SIGUSR1)  # train what is on samples.scored, then stop
        assert trainer.wait(timeout=600) == 0, (tmp_path / "train.log").read_text()[-3000:]
        elapsed = time.monotonic() - started
        calls = json.loads(urllib.request.urlopen(url + "/sim/stats", timeout=10).read())["calls"]
    finally:
        stop(procs)
        sim.kill()
        sim.wait(timeout=10)
    samples = [
        decode_as(Sample, r.value)
        for r in read_all(settings, settings.topics.samples_scored.name, timeout_s=120)
    ]
    scored, retried = finished(settings)
    included = {s.sample_id for s in samples if s.loss_mask == 1}
    trained = trained_ids(ledger)
    duplicates = sum(n - 1 for n in scored.values())
    print(
        f"\nbroker restarts: {len(expected)} turns in {elapsed:.0f}s; "
        + "; ".join(
            f"{how}: down {r['down_s']:.1f}s (restart {r['start_s']:.1f}s of it, "
            f"{r['sent_while_down']:.0f} events produced meanwhile), first sample scored "
            f"{r.get('scored_s', -1):.1f}s (worker 0 {r.get('w0_scored_s', -1):.1f}s, worker 1 "
            f"{r.get('w1_scored_s', -1):.1f}s) and first trainer step "
            f"{r.get('trained_s', -1):.1f}s after the broker was back"
            for how, r in recoveries.items()
        )
        + f"; lost={len(missing)} retried={len(retried)} duplicates={duplicates} "
        f"judge_calls={calls} (extra {calls - 3 * judged}); trained {len(trained)} "
        f"(unique {len(set(trained))}) of {len(included)} included"
    )
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    assert all("scored_s" in r and "trained_s" in r for r in recoveries.values()), recoveries
    # every worker scores again soon after the broker is back (it rejoins its group itself)
    assert all(r.get(f"w{i}_scored_s", 1e9) <= 10 for r in recoveries.values() for i in (0, 1)), (
        recoveries
    )
    assert all(r["sent_while_down"] > 0 for r in recoveries.values())  # produced throughout
    assert sorted(trained) == sorted(included)  # every included sample_id exactly once
    group = settings.topic_prefix + "turnstream-trainer"
    assert group_lag(settings, group, [settings.topics.samples_scored.name]) == 0


def assert_alive(procs: list[subprocess.Popen], tmp_path: Path) -> None:
    for proc, log in zip(procs, ("w0.log", "w1.log", "train.log"), strict=True):
        assert proc.poll() is None, f"{log}:\n" + (tmp_path / log).read_text()[-3000:]


def wait_finished(
    settings: Settings, expected: set[str], procs: list[subprocess.Popen], tmp_path: Path
) -> set[str]:
    deadline = time.monotonic() + 300
    while True:
        scored, retried = finished(settings)
        missing = expected - set(scored) - retried
        if not missing or time.monotonic() > deadline:
            return missing
        assert_alive(procs, tmp_path)
        time.sleep(3)


def test_trainer_killed_mid_step_trains_each_sample_once(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL at random moments while it steps and checkpoints, three times."""
    admin.apply(settings)
    rng = random.Random(7)
    included = [sample(i, ids=True) for i in range(240)]
    excluded = [sample(1000 + i, mask=0, reason="neutral_score") for i in range(20)]
    redelivered = rng.sample(included, 30)  # as a worker's redelivery would put them again
    records = included + excluded
    for dup in redelivered:
        records.insert(records.index(dup) + rng.randint(1, 40), dup)
    publish(settings, records)
    config = write_config(tmp_path, policy_url=None)
    ledger = tmp_path / "ledger.tsv"
    args = ["pipeline.cli", *train_args(config, ledger)]
    kills, at_kills, started = 0, [], time.monotonic()
    while kills < 3:
        log = tmp_path / f"train{kills}.log"
        proc = spawn(args, log, cli_env)
        mark = ledger_lines(ledger) + 20  # a few steps into this run
        while ledger_lines(ledger) < mark:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() - started < 600
            time.sleep(0.02)
        time.sleep(rng.uniform(0.05, 0.6))  # somewhere in a step or its checkpoint
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        at_kill = ledger_lines(ledger)
        assert at_kill < len(included), "the trainer finished before it was killed"
        at_kills.append(at_kill)
    final = spawn(args, tmp_path / "final.log", cli_env)
    assert final.wait(timeout=600) == 0, (tmp_path / "final.log").read_text()[-3000:]
    out = (tmp_path / "final.log").read_text()
    trained = trained_ids(ledger)
    skipped = out.rsplit("skipped ", 1)[-1].strip()
    print(
        f"\ntrainer kills: {kills} kills in {time.monotonic() - started:.0f}s; trained "
        f"{len(trained)} (unique {len(set(trained))}) of {len(included)} included; "
        f"killed with {at_kills} samples trained; {len(redelivered)} duplicates on the "
        f"topic; skipped {skipped}"
    )
    assert sorted(trained) == sorted(s.sample_id for s in included)
    # the checkpoint counts only records below its offsets: none counted twice
    counted = ast.literal_eval(skipped.splitlines()[0])
    assert counted == {"duplicate": len(redelivered), "excluded:neutral_score": len(excluded)}
    group = settings.topic_prefix + "turnstream-trainer"
    assert group_lag(settings, group, [settings.topics.samples_scored.name]) == 0
