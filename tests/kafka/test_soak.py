"""Soak: scoring workers killed with SIGKILL mid-run and restarted lose nothing (make soak).

Two workers score a long run while one of them is killed with SIGKILL and
restarted several times. Every main turn must end on samples.scored (or, with
its reason, samples.retry); duplicates are counted (the trainer collapses them
by sample_id) and so are the judge calls they cost. The size is
TURNSTREAM_SOAK_TURNS (default 20,000 turns, as in the reliability goal).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from pipeline.broker.local import free_port_pair
from pipeline.events import RetryRecord, Sample, decode_as
from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets
from tests.kafka.helpers import read_all, spawn, turnstream, wait_http
from tests.kafka.test_scoring_e2e import start_worker, stop

pytestmark = pytest.mark.slow

TURNS = int(os.environ.get("TURNSTREAM_SOAK_TURNS", "20000"))
PER_SESSION = 5


def write_sessions(path: Path, turns: int) -> tuple[set[str], int]:
    """Sessions of PER_SESSION main turns each, interleaved; (sample ids, judged pairs)."""
    sessions = max(1, turns // PER_SESSION)
    now = time.time()
    with open(path, "w") as out:
        for t in range(PER_SESSION):
            for s in range(sessions):
                out.write(
                    json.dumps(
                        {"type": "turn", "session_id": f"soak-{s:05d}", "turn_index": t,
                         "turn_type": "main", "ts": now,
                         "messages": [{"role": "user", "content": f"step {t} of job {s}"}],
                         "response": {"content": f"ran step {t}"}}
                    )
                    + "\n"
                )  # fmt: skip
        for s in range(sessions):
            out.write(json.dumps({"type": "session_end", "session_id": f"soak-{s:05d}",
                                  "ts": now}) + "\n")  # fmt: skip
    ids = {f"soak-{s:05d}:{t}" for s in range(sessions) for t in range(PER_SESSION)}
    return ids, sessions * (PER_SESSION - 1)


def finished(settings: Settings) -> tuple[Counter[str], set[str]]:
    scored = Counter(
        decode_as(Sample, r.value).sample_id
        for r in read_all(settings, settings.topics.samples_scored.name, timeout_s=120)
    )
    retried = {
        decode_as(RetryRecord, r.value).paired.sample_id
        for r in read_all(settings, settings.topics.samples_retry.name, timeout_s=120)
    }
    return scored, retried


def duplicates_now(settings: Settings) -> int:
    records = read_all(settings, settings.topics.samples_scored.name, timeout_s=120)
    return len(records) - len({decode_as(Sample, r.value).sample_id for r in records})


def test_workers_killed_and_restarted_lose_nothing(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "64",
         "--latency-ms", "20"],
        tmp_path / "sim.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", sim)
        expected, judged = write_sessions(tmp_path / "soak.jsonl", TURNS)
        assert turnstream("produce", str(tmp_path / "soak.jsonl"), env=cli_env).returncode == 0
        workers = [
            start_worker(cli_env, url, tmp_path / f"w{i}", tmp_path / f"w{i}-0.log")
            for i in range(2)
        ]
        rng = random.Random(5)
        kills, started = 0, time.monotonic()
        marks: list[int] = []  # duplicates on samples.scored just before each kill
        try:
            scored_topic = settings.topics.samples_scored.name
            while kills < 5:
                # kill a worker that is busy: once the group scored 500 more since the
                # last kill, at a random moment within the next few seconds
                mark = end_offsets(settings, [scored_topic])[scored_topic]
                while end_offsets(settings, [scored_topic])[scored_topic] < mark + 500:
                    assert time.monotonic() - started < 900, "no progress between kills"
                    time.sleep(0.5)
                time.sleep(rng.uniform(0.5, 3))
                marks.append(duplicates_now(settings))
                victim = kills % 2
                os.killpg(workers[victim].pid, signal.SIGKILL)
                workers[victim].wait()
                kills += 1
                workers[victim] = start_worker(
                    cli_env, url, tmp_path / f"w{victim}", tmp_path / f"w{victim}-{kills}.log"
                )
            deadline = time.monotonic() + 900
            while True:
                scored, retried = finished(settings)
                missing = expected - set(scored) - retried
                if not missing or time.monotonic() > deadline:
                    break
                for proc in workers:
                    assert proc.poll() is None, f"a worker exited with {proc.returncode}"
                time.sleep(5)
        finally:
            stop(workers)
        elapsed = time.monotonic() - started
        calls = json.loads(urllib.request.urlopen(url + "/sim/stats", timeout=10).read())["calls"]
    finally:
        sim.kill()  # it holds timed-out calls open; no graceful stop
        sim.wait(timeout=10)
    duplicates = sum(n - 1 for n in scored.values())
    per_kill = [
        after - before for before, after in zip(marks, [*marks[1:], duplicates], strict=True)
    ]
    extra_calls = calls - 3 * judged
    print(
        f"soak: {len(expected)} turns, {kills} kills in {elapsed:.0f}s; lost={len(missing)} "
        f"retried={len(retried)} duplicates={duplicates} (after each kill: {per_kill}) "
        f"judge_calls={calls} (extra {extra_calls} over 3 per judged pair)"
    )
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    assert set(scored) <= expected
    # a worker commits what it handled every 0.1 s: each kill re-judges little. Counted
    # between one kill and the next (or the end); a kill's duplicates surface once its
    # partitions are re-read, sometimes after the next kill, so an interval may hold two
    # kills' worth: bounding each interval is at least as strict as bounding each kill
    assert max(per_kill) <= 0.02 * judged, f"{per_kill} duplicates for {judged} judged pairs"


def test_judge_faults_never_become_scores(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """30% 5xx, 10% timeouts, 10% malformed outputs: every pair is scored from real
    answers or waits on samples.retry; an unreachable judge is never a vote."""
    admin.apply(settings)
    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "64", "--latency-ms",
         "5", "--error-rate", "0.3", "--timeout-rate", "0.1", "--malformed-rate", "0.1",
         "--seed", "3"],
        tmp_path / "sim.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    env = {
        **cli_env,
        "TURNSTREAM_SCORING_JUDGE_MAX_ATTEMPTS": "3",
        "TURNSTREAM_SCORING_JUDGE_TIMEOUT_S": "1",
        # faults are per request: small batches make hundreds of requests, so every kind
        # of fault, and requests that fail all their attempts, surely occur
        "TURNSTREAM_SCORING_JUDGE_BATCH_MAX": "4",
    }
    try:
        wait_http(url + "/health", sim)
        expected, _judged = write_sessions(tmp_path / "faults.jsonl", min(TURNS, 2000))
        assert turnstream("produce", str(tmp_path / "faults.jsonl"), env=env).returncode == 0
        worker = start_worker(env, url, tmp_path / "w", tmp_path / "w.log")
        try:
            deadline = time.monotonic() + 900
            while True:
                scored, retried = finished(settings)
                missing = expected - set(scored) - retried
                if not missing or time.monotonic() > deadline:
                    break
                assert worker.poll() is None, (tmp_path / "w.log").read_text()[-3000:]
                time.sleep(5)
        finally:
            stop([worker])
        stats = json.loads(urllib.request.urlopen(url + "/sim/stats", timeout=10).read())
    finally:
        sim.kill()  # it holds timed-out calls open; no graceful stop
        sim.wait(timeout=10)
    samples = [
        decode_as(Sample, r.value)
        for r in read_all(settings, settings.topics.samples_scored.name, timeout_s=120)
    ]
    retries = [
        decode_as(RetryRecord, r.value)
        for r in read_all(settings, settings.topics.samples_retry.name, timeout_s=120)
    ]
    failed_votes = sum(v is None for s in samples for v in s.votes)
    print(
        f"faults: {len(expected)} turns; scored={len(set(scored))} retried={len(retried)} "
        f"failed votes in samples={failed_votes}; simulator {stats}"
    )
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    assert retries and stats["errors"] and stats["timeouts"] and stats["malformed"]
    assert all(
        "unreachable" in r.error and ("503" in r.error or "no answer" in r.error) for r in retries
    ), {r.error for r in retries}
    judged = [s for s in samples if s.next_state is not None]
    assert all(s.judge_calls == 3 and len(s.votes) == 3 for s in judged)
    # A failed vote in a sample can only be a malformed answer: an unreachable judge sends
    # the whole pair to samples.retry instead of counting as a vote.
    assert failed_votes <= stats["malformed"]


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children (the worker runs in one process)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_a_slow_judge_grows_lag_not_memory(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Backpressure: with a judge at a small share of the needed capacity the backlog
    stays in Kafka (consumer lag grows) while the worker's memory stays bounded."""
    from pipeline.topics.offsets import group_lag

    admin.apply(settings)
    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "4", "--latency-ms",
         "100"],
        tmp_path / "sim.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    group = settings.topic_prefix + "turnstream-scoring"
    paired = settings.topics.turns_paired.name
    try:
        wait_http(url + "/health", sim)
        write_sessions(tmp_path / "backlog.jsonl", TURNS)
        assert turnstream("produce", str(tmp_path / "backlog.jsonl"), env=cli_env).returncode == 0
        worker = start_worker(cli_env, url, tmp_path / "w", tmp_path / "w.log")
        samples: list[tuple[float, float, int | None]] = []  # (seconds, RSS MB, lag)
        started = time.monotonic()
        try:
            while (elapsed := time.monotonic() - started) < 90:
                assert worker.poll() is None, (tmp_path / "w.log").read_text()[-3000:]
                samples.append((elapsed, rss_mb(worker.pid), group_lag(settings, group, [paired])))
                time.sleep(3)
        finally:
            stop([worker])
    finally:
        sim.kill()  # it holds timed-out calls open; no graceful stop
        sim.wait(timeout=10)
    warm = [s for s in samples if s[0] >= 30]  # after start-up and the first fetches
    lags = [lag for _t, _m, lag in samples if lag is not None]
    peak = max(m for _t, m, _l in samples)
    window = settings.scoring.window
    print(
        f"backpressure: peak RSS {peak:.0f} MB; RSS at 30s {warm[0][1]:.0f} MB, at the end "
        f"{warm[-1][1]:.0f} MB; turns.paired lag first {lags[0]}, peak {max(lags)}, "
        f"last {lags[-1]} (window {window} pairs)"
    )
    assert max(lags) > 10 * window  # the backlog waits in Kafka, not in the worker
    assert warm[-1][1] < warm[0][1] * 1.25 + 20  # memory does not grow with it
