"""The pipeline under load on a three-broker cluster: simulated users through the capture
proxy, two scoring workers, the trainer, and a monitor of what reaches samples.scored.

A scenario starts a :class:`Stack` on topics of its own (the cluster profile: three replicas,
two in sync), hurts the cluster while the users talk, then stops the users and checks that
nothing was lost (:func:`audit`).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from pipeline.broker.cluster import LocalCluster
from pipeline.broker.following import Follower
from pipeline.broker.local import free_port_pair
from pipeline.events import RetryRecord, Sample, decode_as, decode_input
from pipeline.settings import KafkaSettings, Settings
from pipeline.topics import admin
from pipeline.topics.offsets import group_lag
from tests.kafka.helpers import read_all, spawn, wait_http
from tests.kafka.test_proxy import start_proxy, start_sim
from tests.kafka.test_scoring_e2e import start_worker
from tests.kafka.test_trainer import write_config

TURNS_PER_SESSION = 4


@dataclass
class Users:
    """Simulated users: ``count`` threads, each holding sessions of TURNS_PER_SESSION turns
    through the proxy (the next turn's message is the previous answer's next state).

    Each thread appends only to its own entries of ``served``; the test reads them after
    :meth:`stop` has joined the threads.
    """

    proxy: str
    prefix: str
    count: int = 4
    think_s: float = 0.25
    served: list[list[str]] = field(default_factory=list)  # sample ids the users got answers to
    errors: list[str] = field(default_factory=list)  # what a user saw go wrong
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.count):
            self.served.append([])
            thread = threading.Thread(target=self._talk, args=(n,), name=f"user{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Let every user finish the session it is in, then return."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def _talk(self, n: int) -> None:
        session = 0
        while not self._stop.is_set():
            sid = f"{self.prefix}u{n}-{session}"
            messages: list[dict[str, str]] = []
            for turn in range(TURNS_PER_SESSION):
                messages.append({"role": "user", "content": f"user {n} asks {session}.{turn}"})
                answer = self._ask(sid, messages, done=turn == TURNS_PER_SESSION - 1)
                if answer is None:
                    break
                self.served[n].append(f"{sid}:{turn}")
                messages.append({"role": "assistant", "content": answer})
                time.sleep(self.think_s)
            session += 1

    def _ask(self, sid: str, messages: list[dict[str, str]], done: bool) -> str | None:
        body = json.dumps({"model": "m", "messages": messages}).encode()
        request = urllib.request.Request(
            self.proxy + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", "X-Session-Id": sid,
                     "X-Turn-Type": "main", "X-Session-Done": str(done).lower()},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["choices"][0]["message"]["content"]
        except (OSError, ValueError, KeyError) as exc:  # an HTTP error status is an OSError
            self.errors.append(f"{sid} turn {len(messages) // 2}: {exc!r}")
            return None


@dataclass
class Monitor:
    """Follows samples.scored (every partition, no group) and the trainer's ledger: the
    times at which samples arrived and training went on. A partition whose leader is away
    holds back only its own records. The thread alone appends; the test reads after
    :meth:`stop`."""

    settings: Settings
    ledger: Path
    scored_at: list[float] = field(default_factory=list)
    trained_at: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        follower = Follower(self.settings, [self.settings.topics.samples_scored.name])
        trained = 0
        try:
            while not self._stop.is_set():
                arrived = follower.poll(timeout_ms=200)
                now, now_trained = time.monotonic(), ledger_lines(self.ledger)
                if arrived:
                    self.scored_at.append(now)
                if now_trained > trained:
                    self.trained_at.append(now)
                trained = now_trained
        finally:
            follower.close()

    def recovery(self, fault_at: float, back_at: float, until: float) -> dict[str, float]:
        """Seconds from the fault (and from the broker's return) to the first sample scored
        and trained after it, and the longest pause in scoring from the fault to ``until``
        (the next fault, or the end)."""
        out: dict[str, float] = {}
        for name, times in (("scored", self.scored_at), ("trained", self.trained_at)):
            after = [t for t in times if t > fault_at]
            out[f"first_{name}_s"] = round(after[0] - fault_at, 2) if after else -1.0
            after_back = [t for t in times if t > back_at]
            out[f"first_{name}_after_back_s"] = (
                round(after_back[0] - back_at, 2) if after_back else -1.0
            )
        window = [fault_at] + [t for t in self.scored_at if fault_at < t <= until]
        out["longest_scoring_pause_s"] = round(
            max((b - a for a, b in pairwise(window)), default=-1.0), 2
        )
        return out


def ledger_lines(ledger: Path) -> int:
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


@dataclass
class Stack:
    """Every process of one scenario; :meth:`close` stops them all."""

    cluster: LocalCluster
    settings: Settings
    tmp: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    judge: str = ""
    proxy: str = ""
    users: Users | None = None
    monitor: Monitor | None = None

    @property
    def ledger(self) -> Path:
        return self.tmp / "ledger.tsv"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=self.settings.bootstrap_servers,
            TURNSTREAM_TOPIC_PREFIX=self.settings.topic_prefix,
            TURNSTREAM_TOPICS_PROFILE="cluster",
        )
        return env

    def start(self) -> None:
        admin.apply(self.settings)
        port = free_port_pair()
        self.procs["judge"] = spawn(
            ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "64",
             "--latency-ms", "20", "--agreement", "1.0"],
            self.tmp / "judge.log",
        )  # fmt: skip
        self.judge = f"http://127.0.0.1:{port}"
        wait_http(self.judge + "/health", self.procs["judge"])
        for i in range(2):
            self.procs[f"worker{i}"] = start_worker(
                self.env, self.judge, self.tmp / f"w{i}", self.tmp / f"worker{i}.log"
            )
        config = write_config(self.tmp, policy_url=None)
        self.procs["trainer"] = spawn(
            ["pipeline.cli", "train", "--config", str(config), "--ledger", str(self.ledger)],
            self.tmp / "trainer.log",
            self.env,
        )
        policy, self.procs["policy"] = start_sim(self.tmp)
        self.proxy, self.procs["proxy"] = start_proxy(
            self.env, policy, self.tmp / "proxy", self.tmp / "proxy.log"
        )
        self.monitor = Monitor(self.settings, self.ledger)
        self.monitor.start()
        self.users = Users(self.proxy, prefix=self.settings.topic_prefix)
        self.users.start()

    def assert_alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n" + self.log(name)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def wait_training(self, lines: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while ledger_lines(self.ledger) < lines:
            self.assert_alive()
            assert time.monotonic() < deadline, "no training yet:\n" + self.log("trainer")
            time.sleep(0.5)

    def hold(self, seconds: float) -> None:
        """Keep the load on for ``seconds``, checking every process stays up."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.assert_alive()
            time.sleep(0.5)

    def proxy_health(self) -> dict:
        return json.loads(urllib.request.urlopen(self.proxy + "/healthz", timeout=10).read())

    def finish(self) -> Audit:
        """Stop the users, wait until every turn is scored and the proxy's spool is empty,
        drain the trainer, and read everything back."""
        assert self.users is not None and self.monitor is not None
        self.users.stop()
        served = {sid for user in self.users.served for sid in user}
        deadline = time.monotonic() + 300
        while (kafka := self.proxy_health()["kafka"])["spool_pending"] or kafka["buffered"]:
            assert time.monotonic() < deadline, self.log("proxy")
            time.sleep(0.5)
        audit = Audit(self.settings, served, self.users.errors)
        while audit.unfinished():
            self.assert_alive()
            assert time.monotonic() < deadline, f"unscored: {sorted(audit.unfinished())[:5]}"
            time.sleep(3)
            audit = Audit(self.settings, served, self.users.errors)
        os.killpg(self.procs["trainer"].pid, signal.SIGUSR1)  # train what is there, then stop
        assert self.procs["trainer"].wait(timeout=600) == 0, self.log("trainer")
        self.monitor.stop()
        audit.read_ledger(self.ledger)
        return audit

    def close(self) -> None:
        if self.users is not None:
            self.users.stop()
        if self.monitor is not None:
            self.monitor.stop()
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def stack_settings(cluster: LocalCluster, prefix: str) -> Settings:
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=cluster.bootstrap),
        topic_prefix=prefix,
        topics_profile="cluster",
        producer_linger_ms=0,
    )


class Audit:
    """What reached each topic, against what the users were served."""

    def __init__(self, settings: Settings, served: set[str], user_errors: list[str]) -> None:
        topics = settings.topics
        self.settings = settings
        self.served = served
        self.user_errors = user_errors
        turns = [decode_input(r.value) for r in read_all(settings, topics.chat_turns.name, 120)]
        self.captured = Counter(
            f"{e.session_id}:{e.turn_index}" for e in turns if getattr(e, "type", "") == "turn"
        )
        self.samples = [
            decode_as(Sample, r.value) for r in read_all(settings, topics.samples_scored.name, 120)
        ]
        self.scored = Counter(s.sample_id for s in self.samples)
        self.retried = {
            decode_as(RetryRecord, r.value).paired.sample_id
            for r in read_all(settings, topics.samples_retry.name, 120)
        }
        self.trained: list[str] = []

    def unfinished(self) -> set[str]:
        return self.served - set(self.scored) - self.retried

    def read_ledger(self, ledger: Path) -> None:
        self.trained = [line.split("\t")[1] for line in ledger.read_text().splitlines()]

    @property
    def included(self) -> set[str]:
        return {s.sample_id for s in self.samples if s.loss_mask == 1}

    @property
    def judged(self) -> int:
        return len({s.sample_id for s in self.samples if s.next_state is not None})

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.scored.values())

    def false_scores(self) -> list[str]:
        """Samples whose score is not their three agreeing votes (the judge simulator agrees
        with itself: every vote of a pair is its one true label), or whose copies differ."""
        wrong, seen = [], {}
        for s in self.samples:
            if s.next_state is None:
                continue
            if len(s.votes) != 3 or len(set(s.votes)) != 1 or s.votes[0] != s.score:
                wrong.append(f"{s.sample_id}: score {s.score} votes {s.votes}")
            if seen.setdefault(s.sample_id, s.score) != s.score:
                wrong.append(f"{s.sample_id}: copies scored {seen[s.sample_id]} and {s.score}")
        return wrong

    def assert_nothing_lost(self, faults: int) -> None:
        lost_turns = self.served - set(self.captured)
        assert not self.user_errors, f"users saw errors: {self.user_errors[:5]}"
        assert not lost_turns, f"{len(lost_turns)} turns lost, e.g. {sorted(lost_turns)[:5]}"
        assert not self.unfinished(), f"unscored: {sorted(self.unfinished())[:5]}"
        assert set(self.scored) <= self.served
        assert not self.false_scores(), self.false_scores()[:5]
        assert sorted(self.trained) == sorted(self.included)  # each exactly once
        group = self.settings.topic_prefix + "turnstream-trainer"
        assert group_lag(self.settings, group, [self.settings.topics.samples_scored.name]) == 0
        # the soak test's bound on what one worker kill may re-score
        assert self.duplicates <= max(1, faults) * 0.02 * self.judged, (
            f"{self.duplicates} duplicates for {self.judged} judged pairs and {faults} faults"
        )

    def summary(self) -> dict[str, float]:
        return {
            "served_turns": len(self.served),
            "captured_twice": sum(n > 1 for n in self.captured.values()),
            "judged_pairs": self.judged,
            "retried": len(self.retried),
            "duplicates": self.duplicates,
            "trained": len(self.trained),
            "trained_unique": len(set(self.trained)),
            "included": len(self.included),
            "user_errors": len(self.user_errors),
        }


def percentiles(values: list[float]) -> dict[str, float]:
    good = [v for v in values if v >= 0]
    if not good:
        return {"p50": -1.0, "max": -1.0}
    return {"p50": round(statistics.median(good), 2), "max": round(max(good), 2)}


def wait_in_sync(cluster: LocalCluster, topics: list[str], timeout_s: float = 180.0) -> float:
    """Until every partition of ``topics`` has all its replicas in sync; seconds waited."""
    started = time.monotonic()
    while True:
        described = cluster.ask(lambda a: a.describe_topics(topics))
        short = [
            (t["name"], p["partition_index"])
            for t in described
            for p in t["partitions"]
            if set(p["isr_nodes"]) != set(p["replica_nodes"])
        ]
        if not short:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"under-replicated: {short[:5]}"
        time.sleep(0.5)
