"""Three brokers beside one, on the same machine in one run: produce, replay, saturation.

For each of a fresh single broker and a fresh local three-broker cluster (the cluster
profile of topics.yaml: every topic on three replicas, min.insync.replicas 2, so each
acks=all write waits for a second copy), the same three measurements as
benchmarks/produce.py (`turnstream produce` vs `kcat -P`), benchmarks/replay.py
(`turnstream replay` vs a kcat copy pipe) and one point of benchmarks/saturation.py (a
scoring worker against the judge simulator). Prints one table with the ratios cluster /
one broker and writes benchmarks/results/cluster.json. On one machine the three brokers
share its cores and disk: the ratios show replication's cost, not a cluster's capacity.

    python benchmarks/cluster.py [--events 100000] [--sessions 1000] [--point 64:100]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import produce
import replay
import saturation
from common import broker, write_result
from workload import generate, judged_pairs

from pipeline.settings import Settings

ROWS = (  # (row, figure key, which benchmark)
    ("produce: turnstream produce events/s", "turnstream_events_per_s", "produce"),
    ("produce: kcat -P events/s", "kcat_events_per_s", "produce"),
    ("replay: turnstream replay events/s", "replay_per_s", "replay"),
    ("replay: kcat copy pipe events/s", "kcat_copy_per_s", "replay"),
    ("saturation: pipeline judge calls/s", "calls_per_s", "saturation"),
    ("saturation: simulator utilisation", "utilisation", "saturation"),
)


def measure(settings: Settings, args: argparse.Namespace, tmp: Path) -> dict:
    """The three benchmarks against ``settings``' broker(s)."""
    slots, latency = (float(v) for v in args.point.split(":"))
    lines = generate(args.sessions, seed=7)
    workload = tmp / "workload.jsonl"
    workload.write_bytes(b"\n".join(lines) + b"\n")
    mains = sum(1 for ln in lines if b'"turn_type":"main"' in ln)
    figures: dict[str, dict] = {}
    started = time.monotonic()
    figures["produce"] = produce.run(settings, args.events, tmp, args.compression)
    print(f"  produce done ({time.monotonic() - started:.0f}s)", flush=True)
    figures["replay"] = replay.run(settings, args.events, args.compression)
    print(f"  replay done ({time.monotonic() - started:.0f}s)", flush=True)
    with saturation.judge_sim(settings, int(slots), latency, tmp) as (url, judged):
        figures["saturation"] = saturation.pipeline(judged, workload, url, int(slots), mains, tmp)
    print(f"  saturation done ({time.monotonic() - started:.0f}s)", flush=True)
    figures["seconds"] = round(time.monotonic() - started, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="produce and replay size")
    parser.add_argument("--compression", default="none", choices=["none", "gzip", "lz4", "zstd"])
    parser.add_argument("--sessions", type=int, default=1000, help="saturation workload")
    parser.add_argument("--point", default="64:100", help="saturation SLOTS:LATENCY_MS")
    args = parser.parse_args()
    if shutil.which("kcat") is None:
        sys.exit("kcat is not installed (apt-get install kcat)")
    runs: dict[str, dict] = {}
    for name, brokers in (("one_broker", 1), ("cluster", 3)):
        print(f"{name}: starting {brokers} broker(s)", flush=True)
        with (
            tempfile.TemporaryDirectory() as tmp,
            broker(Path(tmp), brokers=brokers) as settings,
        ):
            if brokers > 1 and settings.topics_profile != "cluster":
                sys.exit("KAFKA_BOOTSTRAP_SERVERS is set: this benchmark starts its own brokers")
            runs[name] = measure(settings, args, Path(tmp))
    table = [
        {
            "row": row,
            "one_broker": runs["one_broker"][bench][key],
            "cluster": runs["cluster"][bench][key],
            "ratio_cluster_over_one": round(
                runs["cluster"][bench][key] / runs["one_broker"][bench][key], 3
            ),
        }
        for row, key, bench in ROWS
    ]
    result = write_result(
        "cluster",
        {"events": args.events, "compression": args.compression, "sessions": args.sessions,
         "judged_pairs": judged_pairs(generate(args.sessions, seed=7)), "point": args.point,
         "cluster": "3 brokers, each a KRaft controller; topics: 3 replicas, min.insync 2",
         "table": table, "runs": runs},
    )  # fmt: skip
    print(f"\ncores={result['cores']} commit={result['commit']}")
    print(f"{'':<40}{'one broker':>12}{'3 brokers':>12}{'ratio':>8}")
    for r in table:
        print(f"{r['row']:<40}{r['one_broker']:>12}{r['cluster']:>12}"
              f"{r['ratio_cluster_over_one']:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
