"""Judge saturation: the full pipeline vs a direct asyncio loop against the same judge.

The judge simulator (a test double) has a fixed capacity: SLOTS concurrent
calls of LATENCY ms each. For each capacity point, the same seeded workload
(benchmarks/workload.py) is judged twice, at the same concurrency settings:

- direct: the worker's own judge code (`score_pair`, m=3) over the workload's
  pairs in an asyncio loop, no Kafka;
- pipeline: `turnstream produce` of the workload's events -> Kafka -> one
  `turnstream worker` (pair -> judge -> mask) -> samples.scored.

Achieved judge calls/s and the simulator's slot utilisation are taken over the
window from the first judge call to the last scored sample. Prints a table,
writes benchmarks/results/saturation.json and saturation.png.

    python benchmarks/saturation.py [--sessions 400] [--points 64:100,192:100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import (
    RESULTS,
    StatsSampler,
    broker,
    produce_file,
    sim_stats,
    spawn,
    spawn_worker,
    stop,
    wait_http,
    write_result,
)
from workload import generate, judged_pairs

from pipeline.broker.local import free_port_pair
from pipeline.events import decode_input
from pipeline.judge.factory import build_judge
from pipeline.scoring.pairing import pair_step
from pipeline.scoring.scorers import score_pair
from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets


def window(before: dict, after: dict, seconds: float, slots: int) -> tuple[float, float]:
    calls = after["calls"] - before["calls"]
    busy = after["busy_slot_seconds"] - before["busy_slot_seconds"]
    return calls / seconds, busy / (seconds * slots)


def figures(before: dict, after: dict, seconds: float, slots: int, sampler: StatsSampler) -> dict:
    rate, util = window(before, after, seconds, slots)
    steady_rate, steady_util = sampler.steady(slots)
    return {"seconds": round(seconds, 2), "calls_per_s": round(rate, 1),
            "utilisation": round(util, 4), "steady_calls_per_s": round(steady_rate, 1),
            "steady_utilisation": round(steady_util, 4)}  # fmt: skip


def direct(settings: Settings, lines: list[bytes], url: str, slots: int) -> dict:
    states: dict = {}
    pairs = []
    for line in lines:
        event = decode_input(line)
        step = pair_step(states.get(event.session_id), event, 1.0, 1e9)
        states[event.session_id] = step.state
        pairs += [p for p in step.pairs if p.next_state is not None]

    async def run() -> tuple[float, dict, dict]:
        judge, teacher = build_judge(settings)
        gate = asyncio.Semaphore(settings.scoring.window)

        async def one(pair) -> None:  # type: ignore[no-untyped-def]
            async with gate:
                await score_pair(pair, judge, settings.scoring.mode, teacher)

        before = sim_stats(url)
        start = time.monotonic()
        await asyncio.gather(*(one(p) for p in pairs))
        seconds = time.monotonic() - start
        after = sim_stats(url)
        await judge.client.close()  # type: ignore[attr-defined]
        return seconds, before, after

    with StatsSampler(url) as sampler:
        seconds, before, after = asyncio.run(run())
    return {"pairs": len(pairs), **figures(before, after, seconds, slots, sampler)}


def pipeline(
    settings: Settings,
    workload: Path,
    url: str,
    slots: int,
    expected: int,
    tmp: Path,
    wrap: list[str] | None = None,
) -> dict:
    prefix = f"sat{uuid.uuid4().hex[:6]}."
    settings = settings.model_copy(update={"topic_prefix": prefix})
    admin.apply(settings)
    log = tmp / f"worker-{prefix}.log"
    concurrency = settings.scoring.judge_concurrency
    worker = spawn_worker(settings, url, tmp / f"w-{prefix}", log, concurrency, wrap)
    try:
        produce_file(settings, workload)
        scored = settings.topics.samples_scored.name
        before = sim_stats(url)
        while sim_stats(url)["calls"] == before["calls"]:  # the worker's first judge call
            if worker.poll() is not None:
                sys.exit(log.read_text()[-2000:])
            time.sleep(0.05)
        start = time.monotonic()
        deadline = start + 900
        with StatsSampler(url) as sampler:
            while end_offsets(settings, [scored])[scored] < expected:
                if worker.poll() is not None or time.monotonic() > deadline:
                    sys.exit("the worker stopped or did not finish; see its log in " + str(tmp))
                time.sleep(0.1)
            seconds = time.monotonic() - start
            after = sim_stats(url)
    finally:
        stop(worker, wrapped=wrap is not None)
    return figures(before, after, seconds, slots, sampler)


@contextmanager
def judge_sim(
    settings: Settings, slots: int, latency_ms: float, tmp: Path
) -> Iterator[tuple[str, Settings]]:
    """A judge simulator of ``slots`` x ``latency_ms``: its URL, and ``settings`` judging
    there with every slot (stopped afterwards)."""
    port = free_port_pair()
    url = f"http://127.0.0.1:{port}"
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--slots", str(slots),
         "--latency-ms", str(latency_ms)],
        dict(os.environ), tmp / f"sim{port}.log",
    )  # fmt: skip
    try:
        wait_http(url + "/health", sim, tmp / f"sim{port}.log")
        scoring = settings.scoring.model_copy(  # both paths may use every slot
            update={"judge": "sglang", "judge_urls": [url], "judge_concurrency": slots}
        )
        yield url, settings.model_copy(update={"scoring": scoring})
    finally:
        stop(sim)


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate_ax, util_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [f"{r['slots']}x{r['latency_ms']:g}ms" for r in rows]
    x = range(len(rows))
    for offset, key, color in ((-0.2, "direct", "tab:gray"), (0.2, "pipeline", "tab:blue")):
        rate_ax.bar([i + offset for i in x], [r[key]["calls_per_s"] for r in rows], 0.4,
                    label=key, color=color)  # fmt: skip
        util_ax.bar([i + offset for i in x], [100 * r[key]["utilisation"] for r in rows], 0.4,
                    label=key, color=color)  # fmt: skip
    rate_ax.plot(x, [r["capacity_calls_per_s"] for r in rows], "k_", markersize=30,
                 label="capacity")  # fmt: skip
    rate_ax.set(title="judge calls/s", xticks=list(x), xticklabels=labels)
    util_ax.set(title="simulator slot utilisation %", xticks=list(x), xticklabels=labels,
                ylim=(0, 105))  # fmt: skip
    rate_ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--points", default="64:100,192:100", help="SLOTS:LATENCY_MS,...")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the worker under py-spy; collapsed stacks to results/saturation-profile-*.txt",
    )
    args = parser.parse_args()
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if args.profile and spy is None:
        sys.exit("--profile needs py-spy (pip install py-spy)")
    lines = generate(args.sessions, seed=7)
    expected_pairs = judged_pairs(lines)
    mains = sum(1 for ln in lines if b'"turn_type":"main"' in ln)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name, broker(Path(tmp_name)) as settings:
        tmp = Path(tmp_name)
        workload = tmp / "workload.jsonl"
        workload.write_bytes(b"\n".join(lines) + b"\n")
        for point in args.points.split(","):
            slots, latency = (float(v) for v in point.split(":"))
            with judge_sim(settings, int(slots), latency, tmp) as (url, judged):
                base = direct(judged, lines, url, int(slots))
                profile = RESULTS / f"saturation-profile-{int(slots)}x{latency:g}ms.txt"
                spy_cmd = [spy or "py-spy", "record", "--rate", "50", "--format", "raw",
                           "--output", str(profile), "--"]  # fmt: skip
                piped = pipeline(judged, workload, url, int(slots), mains, tmp,
                                 spy_cmd if args.profile else None)  # fmt: skip
            capacity = slots / (latency / 1000)
            rows.append({
                "slots": int(slots), "latency_ms": latency, "capacity_calls_per_s": capacity,
                "direct": base, "pipeline": piped,
                "ratio_pipeline_over_direct": round(piped["calls_per_s"] / base["calls_per_s"], 3),
            })  # fmt: skip
    result = write_result(
        "saturation",
        {"sessions": args.sessions, "judged_pairs": expected_pairs, "judge_calls_per_pair": 3,
         "judge_concurrency": "= slots",
         "window": settings.scoring.window, "points": rows},
    )  # fmt: skip
    chart(rows, RESULTS / "saturation.png")
    print(f"\ncores={result['cores']} commit={result['commit']} pairs={expected_pairs} (m=3)")
    print("whole run: first judge call to last scored sample; steady: 10%..90% of the calls")
    print(f"{'capacity':<19}{'path':<10}{'calls/s':>10}{'util %':>9}{'steady/s':>10}"
          f"{'steady %':>10}{'seconds':>9}")  # fmt: skip
    for r in rows:
        label = f"{r['slots']}x{r['latency_ms']:g}ms={r['capacity_calls_per_s']:g}/s"
        for key in ("direct", "pipeline"):
            v = r[key]
            print(f"{label:<19}{key:<10}{v['calls_per_s']:>10}{100 * v['utilisation']:>9.1f}"
                  f"{v['steady_calls_per_s']:>10}{100 * v['steady_utilisation']:>10.1f}"
                  f"{v['seconds']:>9}")  # fmt: skip
        print(f"{'':<19}{'ratio':<10}{r['ratio_pipeline_over_direct']:>10}")


if __name__ == "__main__":
    main()
