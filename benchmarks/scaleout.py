"""Scale-out: one vs two scoring workers on a CPU-bound setting, and a rebalance mid-run.

The judge simulator (a test double) answers at once (latency 0), so the workers'
own CPU is the limit. The same seeded workload (benchmarks/workload.py) is
produced to fresh topics for each run:

- 1 worker: throughput, first judge call to last scored sample;
- 2 workers, started together: the same;
- rebalance: 1 worker, and a second one joining once a third of the samples
  are scored; then every main turn must have its sample on samples.scored.
  Lost = main turns without a sample (must be 0); duplicates = extra records
  for a sample_id already there (the trainer collapses them by sample_id).

Worker CPU per judged pair: the workers' user + system CPU seconds from the
moment the workload starts arriving (the workers already up and idle) to the
last scored sample — pairing, judging and all Kafka traffic — over the pairs
with a next state (each judged with m=3 votes; the others pass through
without a call). Throughput is timed from the first judge call.

Prints a table, writes benchmarks/results/scaleout.json and scaleout.png.
On a machine with fewer cores than processes (broker, simulator, workers) the
ratio says how much the second worker can still add there.

    python benchmarks/scaleout.py [--sessions 600] [--only-one]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import orjson
from common import (
    RESULTS,
    broker,
    partition_ends,
    produce_file,
    read_all,
    sim_stats,
    spawn,
    spawn_worker,
    stop,
    wait_http,
    write_result,
)
from workload import generate, judged_pairs

from pipeline.broker.local import free_port_pair
from pipeline.settings import Settings
from pipeline.topics import admin


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(procs: list[subprocess.Popen], quiet_s: float = 1.0) -> None:
    """Until the workers have started up: their CPU stays flat for ``quiet_s``."""
    time.sleep(2)
    before = sum(cpu_seconds(p.pid) for p in procs)
    while True:
        time.sleep(quiet_s)
        if any(p.poll() is not None for p in procs):
            sys.exit("a worker exited while starting")
        now = sum(cpu_seconds(p.pid) for p in procs)
        if now - before < 0.05 * len(procs):
            return
        before = now


def scored_count(settings: Settings) -> int:
    return sum(partition_ends(settings, settings.topics.samples_scored.name).values())


def run(
    base: Settings,
    workload: Path,
    expected: set[tuple[str, int]],
    judged: int,
    url: str,
    tmp: Path,
    workers: int,
    join_at: float | None = None,
) -> dict:
    """Score the workload with ``workers`` workers (the second one joining at ``join_at``
    of the samples, or at once) and check every expected sample is there."""
    settings = base.model_copy(update={"topic_prefix": f"so{uuid.uuid4().hex[:6]}."})
    admin.apply(settings)
    procs: list[subprocess.Popen] = []

    def start(i: int) -> None:
        log = tmp / f"{settings.topic_prefix}w{i}.log"
        procs.append(spawn_worker(settings, url, tmp / f"{settings.topic_prefix}w{i}", log, 256))

    try:
        for i in range(workers if join_at is None else 1):
            start(i)
        wait_idle(procs)  # started, joined the group, nothing to do yet
        cpu_before = {p.pid: cpu_seconds(p.pid) for p in procs}
        before = sim_stats(url)
        first = before["calls"]
        feed = threading.Thread(target=produce_file, args=(settings, workload), daemon=True)
        feed.start()
        while sim_stats(url)["calls"] == first:
            if any(p.poll() is not None for p in procs):
                sys.exit(f"a worker exited; see the logs in {tmp}")
            time.sleep(0.05)
        began = time.monotonic()
        joined_at = None
        deadline = began + 900
        while (done := scored_count(settings)) < len(expected):
            if join_at is not None and len(procs) < workers and done >= join_at * len(expected):
                joined_at = done
                start(len(procs))
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                sys.exit(f"a worker exited or the run did not finish; see the logs in {tmp}")
            time.sleep(0.1)
        seconds = time.monotonic() - began
        # everything from the first record on (pairing too); a joining worker's start-up is in
        cpu = sum(cpu_seconds(p.pid) - cpu_before.get(p.pid, 0.0) for p in procs)
        after = sim_stats(url)
        feed.join()
        time.sleep(3)  # anything still in flight (a duplicate) lands before the count
    finally:
        for proc in procs:
            stop(proc)
    samples = (
        orjson.loads(r.value) for r in read_all(settings, settings.topics.samples_scored.name)
    )
    counts = Counter((s["session_id"], s["turn_index"]) for s in samples)
    pairs = (
        orjson.loads(r.value)["turn"] for r in read_all(settings, settings.topics.turns_paired.name)
    )
    paired = Counter((t["session_id"], t["turn_index"]) for t in pairs)
    lost = len(expected - counts.keys())
    duplicates = sum(n - 1 for n in counts.values())
    return {
        "workers": workers,
        "second_joined_at_samples": joined_at,
        "seconds": round(seconds, 2),
        "samples_per_s": round(len(expected) / seconds, 1),
        "samples": len(expected),
        "worker_cpu_s": round(cpu, 2),
        "worker_cpu_ms_per_judged_pair": round(1000 * cpu / judged, 3),
        # SGLang /generate takes a batch: pairs asked at the same moment share a request
        "judge_calls_per_request": round(
            (after["calls"] - before["calls"]) / max(1, after["requests"] - before["requests"]), 2
        ),
        "lost": lost,
        "duplicates": duplicates,
        "paired_duplicates": sum(n - 1 for n in paired.values()),  # from the pairing stage
        "unexpected": len(counts.keys() - expected),
    }


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    labels = [r["label"] for r in rows]
    ax.bar(labels, [r["samples_per_s"] for r in rows], color=["tab:gray", "tab:blue", "tab:green"])
    for i, r in enumerate(rows):
        ax.annotate(f"lost {r['lost']}, dup {r['duplicates']}", (i, r["samples_per_s"]),
                    ha="center", va="bottom", fontsize=8)  # fmt: skip
    ax.set(title="scored samples/s (judge latency 0)", ylabel="samples/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--join-at", type=float, default=1 / 3, help="share of samples scored")
    parser.add_argument("--only-one", action="store_true", help="the 1-worker run alone")
    args = parser.parse_args()
    lines = generate(args.sessions, seed=11)
    expected = {
        (e["session_id"], e["turn_index"])
        for e in map(orjson.loads, lines)
        if e["type"] == "turn" and e["turn_type"] == "main"
    }
    judged = judged_pairs(lines)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name, broker(Path(tmp_name)) as settings:
        tmp = Path(tmp_name)
        workload = tmp / "workload.jsonl"
        workload.write_bytes(b"\n".join(lines) + b"\n")
        port = free_port_pair()
        url = f"http://127.0.0.1:{port}"
        sim = spawn(
            ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "1024",
             "--latency-ms", "0"],
            dict(os.environ), tmp / "sim.log",
        )  # fmt: skip
        try:
            wait_http(url + "/health", sim, tmp / "sim.log")
            runs = [
                ("1 worker", 1, None),
                ("2 workers", 2, None),
                ("1 + 1 joining", 2, args.join_at),
            ]
            for label, workers, join_at in runs[:1] if args.only_one else runs:
                print(f"{label} ...", flush=True)
                rows.append({"label": label, **run(settings, workload, expected, judged, url,
                                                   tmp, workers, join_at)})  # fmt: skip
        finally:
            stop(sim)
    ratio = round(rows[1]["samples_per_s"] / rows[0]["samples_per_s"], 3) if len(rows) > 1 else None
    result = write_result(
        "scaleout",
        {"sessions": args.sessions, "judge_latency_ms": 0, "ratio_2_over_1": ratio, "runs": rows},
    )
    chart(rows, RESULTS / "scaleout.png")
    print(f"\ncores={result['cores']} commit={result['commit']} samples={len(expected)} "
          f"(one per main turn)")  # fmt: skip
    print(f"{'run':<16}{'samples/s':>10}{'seconds':>9}{'lost':>6}{'dup':>6}{'joined at':>11}"
          f"{'CPU ms/judged pair':>20}{'calls/request':>15}")  # fmt: skip
    for r in rows:
        joined = r["second_joined_at_samples"] if r["second_joined_at_samples"] is not None else "-"
        cpu, per_request = r["worker_cpu_ms_per_judged_pair"], r["judge_calls_per_request"]
        print(f"{r['label']:<16}{r['samples_per_s']:>10}{r['seconds']:>9}{r['lost']:>6}"
              f"{r['duplicates']:>6}{joined:>11}{cpu:>20}{per_request:>15}")  # fmt: skip
    if ratio is not None:
        print(f"{'ratio 2/1':<16}{ratio:>10}")


if __name__ == "__main__":
    main()
