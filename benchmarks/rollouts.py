"""Rollouts/s through the rollout stage: `turnstream rollout run` with the policy simulator.

Starts a broker (unless KAFKA_BOOTSTRAP_SERVERS is set), the policy simulator (a
test double, no model: it answers at once, or after --latency-ms), `turnstream
proxy` in front of it and a scoring worker with the rules judge. Runs the SDK
guide's tool-loop rollout processor (examples/sdk, `DemoRolloutProcessor`: a tool
call, its result, an answer) on --tasks tasks x --n rollouts at each
concurrency, and reports the stage's rollouts/s (its own summary) and the
seconds until every captured turn has its sample on samples.scored. Prints a
table and writes benchmarks/results/rollouts.json.

    python benchmarks/rollouts.py [--tasks 100] [--n 4] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import REPO, broker, private_topics, read_all, spawn, stop, wait_http, write_result

from pipeline.broker.local import free_port_pair
from pipeline.events import Sample, Turn, decode_as, decode_input
from pipeline.settings import Settings

PROCESSOR = str(REPO / "examples/sdk/functions/rollout/rollout_only.py") + ":DemoRolloutProcessor"


def task_file(path: Path, tasks: int, run: str) -> Path:
    with path.open("w") as out:
        for i in range(tasks):
            task = {
                "messages": [{"role": "user", "content": f"task {i}: search the weather"}],
                "sampling_params": {"max_turns": 4, "timeout": 60},
                "model_resource": {"model_name": "policy-sim", "base_url": "http://x.invalid/v1"},
                "task_id": f"{run}-{i}",
            }
            out.write(json.dumps(task) + "\n")
    return path


def scored_when_all_in(settings: Settings, run: str, timeout_s: float) -> int:
    """Samples on samples.scored once every turn of ``run``'s tasks has one; their count."""
    deadline = time.monotonic() + timeout_s
    while True:
        turns = [decode_input(r.value) for r in read_all(settings, settings.topics.chat_turns.name)]
        want = {t.sample_id for t in turns if isinstance(t, Turn) and f":{run}-" in t.session_id}
        records = read_all(settings, settings.topics.samples_scored.name)
        got = {decode_as(Sample, r.value).sample_id for r in records}
        if want and want <= got:
            return len(want)
        if time.monotonic() > deadline:
            sys.exit(f"{len(want - got)} turn(s) without a sample after {timeout_s:.0f} s")
        time.sleep(0.2)


def one_run(
    settings: Settings, env: dict[str, str], proxy: str, tmp: Path, args: argparse.Namespace, c: int
) -> dict:
    run = f"c{c}-{uuid.uuid4().hex[:6]}"
    path = task_file(tmp / f"{run}.jsonl", args.tasks, run)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "rollout", "run", "--processor", PROCESSOR,
         "--tasks", str(path), "--n", str(args.n), "--concurrency", str(c),
         "--model-url", proxy + "/v1", "--model-name", "policy-sim"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    stage_s = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"rollout run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    # every rollout succeeded at its first attempt, so the turns on chat.turns are all theirs
    assert summary["attempts"] == summary["rollouts"] == args.tasks * args.n, summary
    samples = scored_when_all_in(settings, run, 600)
    return {
        "concurrency": c,
        "rollouts": summary["rollouts"],
        "stage_s": round(summary["seconds"], 2),
        "rollouts_per_s": round(summary["rollouts"] / summary["seconds"], 1),
        "command_s": round(stage_s, 2),
        "samples": samples,
        "all_scored_s": round(time.monotonic() - started, 2),
    }


@contextmanager
def stack(settings: Settings, env: dict[str, str], tmp: Path, latency_ms: float) -> Iterator[str]:
    """The policy simulator, the proxy in front of it and a rules-judge worker; the proxy's URL."""
    sim_port, proxy_port = free_port_pair(), free_port_pair()
    sim_args = ["pipeline.testing.policy_sim", "--port", str(sim_port)]
    sim = spawn([*sim_args, "--latency-ms", str(latency_ms)], env, tmp / "sim.log")
    proxy_args = ["pipeline.cli", "proxy", "--upstream", f"http://127.0.0.1:{sim_port}"]
    proxy_args += ["--port", str(proxy_port), "--data-dir", str(tmp / "proxy")]
    proxy = spawn(proxy_args, env, tmp / "proxy.log")
    worker_args = ["pipeline.cli", "worker", "--judge", "rules", "--web-port", "0"]
    worker = spawn([*worker_args, "--data-dir", str(tmp / "w")], env, tmp / "w.log")
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health", sim, tmp / "sim.log")
        url = f"http://127.0.0.1:{proxy_port}"
        wait_http(url + "/healthz", proxy, tmp / "proxy.log")
        yield url
    finally:
        for proc in (worker, proxy, sim):
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the simulator's, a call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name, broker(Path(tmp_name)) as base:
        tmp = Path(tmp_name)
        settings, env = private_topics(base, "bench")
        with stack(settings, env, tmp, args.latency_ms) as url:
            rows = [one_run(settings, env, url, tmp, args, c) for c in args.concurrency]
    print(f"{args.tasks} tasks x {args.n} rollouts, the tool-loop processor, policy simulator")
    print("| concurrency | rollouts | stage s | rollouts/s | all scored s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['rollouts']} | {r['stage_s']} | "
              f"{r['rollouts_per_s']} | {r['all_scored_s']} |")  # fmt: skip
    write_result(
        "rollouts",
        {"tasks": args.tasks, "n": args.n, "latency_ms": args.latency_ms, "runs": rows},
    )


if __name__ == "__main__":
    main()
