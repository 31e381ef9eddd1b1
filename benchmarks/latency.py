"""Scoring latency: a next state's arrival in Kafka to its scored sample, by judge load.

The judge simulator (a test double) has a fixed capacity: SLOTS concurrent
calls of LATENCY ms each (default 64 x 100 ms = 640 calls/s, 213 pairs/s at
m=3). One `turnstream worker` scores; for each load level (a fraction of that
capacity) a fresh seeded workload (benchmarks/workload.py) is produced with
Poisson arrivals at the rate that asks the judge for that fraction of its
capacity, and fully scored before the next level starts.

The bench topics keep broker time (``message.timestamp.type=LogAppendTime``),
so both ends are read from the log itself:

- arrival: the append time of the record that completed the pair (the next
  main turn or ``message`` of the session, on chat.turns);
- scored: the append time of the pair's record on samples.scored;
- judge: the sample's own ``timings.judge_s`` (the m=3 votes as the worker
  waited for them, queueing at the judge included), shown beside the total
  and subtracted per sample to give the pipeline's own share;
- the pipeline's share in its two hops, from the pair's append time on
  turns.paired (LogAppendTime too): pairing (arrival -> pair appended: fetch,
  pairing, send) and judging (pair appended -> sample appended, less the judge).

A warm-up at half of the judge's capacity comes first: a fresh broker spends
much of a core compiling its hot paths (the JVM's JIT) in its first minute.

Prints a table, writes benchmarks/results/latency.json and latency.png.

    python benchmarks/latency.py [--levels 0.25,0.5,0.9] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from common import (
    RESULTS,
    broker,
    partition_ends,
    pct,
    read_all,
    sim_stats,
    spawn,
    spawn_worker,
    stop,
    wait_http,
    write_result,
)
from kafka.admin import ConfigResource, ConfigResourceType
from workload import generate, judged_pairs

from pipeline.broker.clients import admin_client, producer
from pipeline.broker.local import free_port_pair
from pipeline.settings import Settings
from pipeline.topics import admin

M = 3  # judge calls per pair in the default `fixed` mode


def log_append_time(settings: Settings, topics: list[str]) -> None:
    client = admin_client(settings)
    try:
        client.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    name,
                    configs={"message.timestamp.type": "LogAppendTime"},
                )
                for name in topics
            ]
        )
    finally:
        client.close()


class KcatSender:
    """The users' producer as kcat (librdkafka, linger 0): it shares this machine with the
    pipeline, and kafka-python at these rates takes a third of a core."""

    def __init__(self, kcat: str, settings: Settings, topic: str) -> None:
        self.proc = subprocess.Popen(
            [kcat, "-P", "-b", settings.bootstrap_servers, "-t", topic, "-K", "\t",
             "-X", "linger.ms=0", "-X", "acks=all"],
            stdin=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdin is not None
        self.pipe = self.proc.stdin

    def send(self, key: bytes, line: bytes) -> None:
        self.pipe.write(key + b"\t" + line + b"\n")
        self.pipe.flush()

    def close(self) -> None:
        self.pipe.close()
        if self.proc.wait(timeout=60) != 0:
            sys.exit(f"kcat -P exited with {self.proc.returncode}")


class KafkaPythonSender:
    """The users' producer where kcat is missing (or the cluster needs credentials)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.prod = producer(settings, 1 << 20, linger_ms=0)
        self.topic = topic

    def send(self, key: bytes, line: bytes) -> None:
        self.prod.send(self.topic, key=key, value=line)

    def close(self) -> None:
        self.prod.flush()
        self.prod.close()


def paced_produce(settings: Settings, topic: str, lines: list[bytes], per_s: float) -> float:
    """Send ``lines`` keyed by session with Poisson arrivals at ``per_s``; the seconds taken."""
    kcat = shutil.which("kcat")
    plain = settings.kafka.security_protocol == "PLAINTEXT"
    sender = (
        KcatSender(kcat, settings, topic) if kcat and plain else KafkaPythonSender(settings, topic)
    )
    rng = random.Random(len(lines))
    start = time.monotonic()
    due = start
    try:
        for line in lines:
            due += rng.expovariate(per_s)
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sender.send(orjson.loads(line)["session_id"].encode(), line)
    finally:
        sender.close()
    return time.monotonic() - start


def mains(lines: list[bytes]) -> int:
    return sum(1 for ln in lines if b'"turn_type":"main"' in ln)


def arrivals(settings: Settings, topic: str, sessions: str) -> dict[tuple[str, int], int]:
    """(session, main turn index) -> append time (ms) of the record that completed its pair."""
    pending: dict[str, int] = {}
    out: dict[tuple[str, int], int] = {}
    for record in read_all(settings, topic):
        event = orjson.loads(record.value)
        sid = event["session_id"]
        if not sid.startswith(sessions):
            continue
        completes = event["type"] == "message" or (
            event["type"] == "turn" and event["turn_type"] == "main"
        )
        if completes and sid in pending:
            out[(sid, pending.pop(sid))] = record.timestamp
        if event["type"] == "turn" and event["turn_type"] == "main":
            pending[sid] = event["turn_index"]
        elif event["type"] == "session_end":
            pending.pop(sid, None)
    return out


def level_run(
    settings: Settings, level: float, capacity_pairs: float, seconds: float, seed: int
) -> dict:
    rate = level * capacity_pairs
    lines = generate(max(1, round(rate * seconds / 5)), seed=seed)  # ~5 judged pairs/session
    pairs = judged_pairs(lines)
    per_s = rate * len(lines) / pairs
    topics = settings.topics
    scored_topic = topics.samples_scored.name
    target = sum(partition_ends(settings, scored_topic).values()) + mains(lines)
    took = paced_produce(settings, topics.chat_turns.name, lines, per_s)
    sessions = f"w{seed}-"
    deadline = time.monotonic() + 300
    while sum(partition_ends(settings, scored_topic).values()) < target:
        if time.monotonic() > deadline:
            sys.exit(f"level {level}: samples did not all arrive within 300 s")
        time.sleep(0.5)
    arrived = arrivals(settings, topics.chat_turns.name, sessions)
    paired = {
        orjson.loads(r.value)["sample_id"]: r.timestamp
        for r in read_all(settings, topics.turns_paired.name)
    }
    totals, judge, own, pair_hop, judge_hop = [], [], [], [], []
    seen: set[tuple[str, int]] = set()
    last_ms = 0
    for record in read_all(settings, scored_topic):
        sample = orjson.loads(record.value)
        key = (sample["session_id"], sample["turn_index"])
        if key not in arrived or key in seen or not sample["judge_calls"]:
            continue
        seen.add(key)
        last_ms = max(last_ms, record.timestamp)
        total_s = (record.timestamp - arrived[key]) / 1000
        judge_s = sample["timings"].get("judge_s", 0.0)
        totals.append(total_s)
        judge.append(judge_s)
        own.append(total_s - judge_s)
        pair_s = (paired[sample["sample_id"]] - arrived[key]) / 1000
        pair_hop.append(pair_s)
        judge_hop.append(total_s - pair_s - judge_s)
    if len(seen) != pairs:
        sys.exit(f"level {level}: {len(seen)} of {pairs} judged pairs found on {scored_topic}")

    def ms(values: list[float], q: float) -> float:
        return round(1000 * pct(values, q), 1)

    return {
        "level": level,
        "pairs_per_s": round(rate, 1),
        "judge_calls_per_s": round(rate * M, 1),
        "events": len(lines),
        "pairs": pairs,
        "produce_seconds": round(took, 2),
        # pairs scored per second, first arrival to last scored sample: below pairs_per_s
        # when the pipeline fell behind
        "scored_per_s": round(pairs / ((last_ms - min(arrived.values())) / 1000), 1),
        **{f"{name}_p{q}_ms": ms(vals, q / 100) for name, vals in
           (("total", totals), ("judge", judge), ("pipeline", own), ("pair_hop", pair_hop),
            ("judge_hop", judge_hop)) for q in (50, 99)},
    }  # fmt: skip


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=False)
    labels = [f"{100 * r['level']:g}%" for r in rows]
    x = range(len(rows))
    for ax, q in zip(axes, (50, 99), strict=True):
        judge = [r[f"judge_p{q}_ms"] for r in rows]
        total = [r[f"total_p{q}_ms"] for r in rows]
        own = [r[f"pipeline_p{q}_ms"] for r in rows]
        ax.bar([i - 0.27 for i in x], total, 0.27, label="arrival -> scored", color="tab:blue")
        ax.bar(list(x), judge, 0.27, label="judge (m=3 votes)", color="tab:gray")
        ax.bar([i + 0.27 for i in x], own, 0.27, label="pipeline (total - judge)",
               color="tab:orange")  # fmt: skip
        ax.set(title=f"p{q} latency, ms", xticks=list(x), xticklabels=labels,
               xlabel="judge load (share of capacity)")  # fmt: skip
    axes[0].legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="0.25,0.5,0.9", help="shares of judge capacity")
    parser.add_argument("--seconds", type=float, default=20.0, help="arrivals per level")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of warm-up at 50%%")
    args = parser.parse_args()
    levels = [float(v) for v in args.levels.split(",")]
    capacity_pairs = args.slots / (args.latency_ms / 1000) / M
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name, broker(Path(tmp_name)) as base:
        tmp = Path(tmp_name)
        prefix = f"lat{uuid.uuid4().hex[:6]}."
        settings = base.model_copy(update={"topic_prefix": prefix})
        admin.apply(settings)
        topics = settings.topics
        log_append_time(
            settings, [topics.chat_turns.name, topics.turns_paired.name, topics.samples_scored.name]
        )
        port = free_port_pair()
        url = f"http://127.0.0.1:{port}"
        sim = spawn(
            ["pipeline.testing.judge_sim", "--port", str(port), "--slots", str(args.slots),
             "--latency-ms", str(args.latency_ms)],
            dict(os.environ), tmp / "sim.log",
        )  # fmt: skip
        worker = spawn_worker(settings, url, tmp / "worker", tmp / "worker.log", args.slots)
        try:
            wait_http(url + "/health", sim, tmp / "sim.log")
            print(f"warm-up: {args.warmup:g} s at 50% of judge capacity", flush=True)
            level_run(settings, 0.5, capacity_pairs, args.warmup, seed=90)
            for i, level in enumerate(levels):
                print(f"level {100 * level:g}% of judge capacity ...", flush=True)
                rows.append(level_run(settings, level, capacity_pairs, args.seconds, 100 + i))
                if worker.poll() is not None:
                    sys.exit(f"the worker exited; see {tmp / 'worker.log'}")
            judge_calls = sim_stats(url)["calls"]
        finally:
            stop(worker)
            stop(sim)
    result = write_result(
        "latency",
        {"slots": args.slots, "latency_ms": args.latency_ms,
         "capacity_pairs_per_s": round(capacity_pairs, 1), "m": M,
         "seconds_per_level": args.seconds, "judge_calls": judge_calls, "levels": rows},
    )  # fmt: skip
    chart(rows, RESULTS / "latency.png")
    print(f"\ncores={result['cores']} commit={result['commit']} judge={args.slots} slots x "
          f"{args.latency_ms:g} ms = {capacity_pairs:.1f} pairs/s at m={M}")  # fmt: skip
    print("milliseconds, next state appended -> scored sample appended (broker time)")
    head = ["load", "pairs/s", "scored/s", "pairs", "total p50", "p99", "judge p50", "p99",
            "pipeline p50", "p99", "pairing p50", "p99", "judging p50", "p99"]  # fmt: skip
    keys = ["pairs_per_s", "scored_per_s", "pairs", "total_p50_ms", "total_p99_ms",
            "judge_p50_ms", "judge_p99_ms", "pipeline_p50_ms", "pipeline_p99_ms",
            "pair_hop_p50_ms", "pair_hop_p99_ms", "judge_hop_p50_ms",
            "judge_hop_p99_ms"]  # fmt: skip
    print(f"{head[0]:<6}" + "".join(f"{h:>13}" for h in head[1:]))
    for r in rows:
        load = f"{100 * r['level']:g}%"
        print(f"{load:<6}" + "".join(f"{r[k]:>13}" for k in keys))
    print(
        "pipeline = pairing hop (arrival -> pair appended) + judging hop (pair appended "
        "-> sample appended, less the judge)"
    )


if __name__ == "__main__":
    main()
