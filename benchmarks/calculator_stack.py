"""The calculator rollout through the whole pipeline, with the real policy.

Starts a broker (unless KAFKA_BOOTSTRAP_SERVERS is set), `turnstream serve`
(SmolLM2-135M-Instruct), the capture proxy in front of it and a scoring worker
whose reward processor is ``examples.rollouts.calculator_reward:CalculatorReward``
(TURNSTREAM_SCORING_REWARDS), then `turnstream rollout run` on
``examples/rollouts/calculator_tasks.jsonl`` with ``--n`` rollouts a task. Each
rollout's last turn is scored by the worker on the whole rollout (its messages
and the task's ground truth); its other turns on their next state (the tool's
result). Reported from samples.scored: rollouts that called the tool, that
were scored correct (the worker's score of the last turn), whether that score
equals the rollout's own ``correct`` metric (computed by the processor, a
check from another place), samples per rollout and the wall time. Prints a
table and writes benchmarks/results/calculator_stack.json.

    python benchmarks/calculator_stack.py [--n 4] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import REPO, broker, private_topics, read_all, spawn, stop, wait_http, write_result

from pipeline.broker.local import free_port_pair
from pipeline.events import Sample, Turn, decode_as, decode_input
from pipeline.settings import Settings

TASKS = REPO / "examples" / "rollouts" / "calculator_tasks.jsonl"
PROCESSOR = "examples.rollouts.calculator:CalculatorRollout"
REWARDS = "processors:\n  - classpath: examples.rollouts.calculator_reward:CalculatorReward\n"


@contextmanager
def stack(env: dict[str, str], tmp: Path, threads: int) -> Iterator[str]:
    """The policy server, the proxy in front of it and a worker scoring with the calculator's
    reward; the proxy's URL."""
    serve_port, proxy_port = free_port_pair(), free_port_pair()
    serve = ["pipeline.cli", "serve", "--port", str(serve_port), "--threads", str(threads)]
    server = spawn([*serve, "--loglevel", "warning"], env, tmp / "serve.log")
    proxy_args = ["pipeline.cli", "proxy", "--upstream", f"http://127.0.0.1:{serve_port}"]
    proxy_args += ["--port", str(proxy_port), "--data-dir", str(tmp / "proxy")]
    proxy = spawn(proxy_args, env, tmp / "proxy.log")
    (tmp / "rewards.yaml").write_text(REWARDS)
    worker_env = {**env, "TURNSTREAM_SCORING_REWARDS": str(tmp / "rewards.yaml")}
    worker_args = ["pipeline.cli", "worker", "--judge", "rules", "--web-port", "0"]
    worker = spawn([*worker_args, "--data-dir", str(tmp / "w")], worker_env, tmp / "w.log")
    try:
        wait_http(f"http://127.0.0.1:{serve_port}/health", server, tmp / "serve.log")
        url = f"http://127.0.0.1:{proxy_port}"
        wait_http(url + "/healthz", proxy, tmp / "proxy.log")
        yield url
    finally:
        for proc in (worker, proxy, server):
            stop(proc)


def all_scored(settings: Settings, timeout_s: float) -> list[Sample]:
    """Every sample, once each turn on chat.turns has one."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = [
            decode_input(r.value) for r in read_all(settings, settings.topics.chat_turns.name)
        ]
        want = {e.sample_id for e in events if isinstance(e, Turn)}
        records = read_all(settings, settings.topics.samples_scored.name)
        samples = [decode_as(Sample, r.value) for r in records]
        if want and want <= {s.sample_id for s in samples}:
            return samples
        if time.monotonic() > deadline:
            sys.exit(f"{len(want - {s.sample_id for s in samples})} turn(s) not scored")
        time.sleep(1.0)


def rollouts_of(samples: list[Sample]) -> list[dict[str, Any]]:
    """One row per trained rollout: its final sample's score beside its own metrics."""
    by_session: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_session[s.session_id].append(s)
    rows = []
    for session, mine in by_session.items():
        mine.sort(key=lambda s: s.turn_index)
        final = mine[-1]
        if final.exclude_reason == "rollout_failed":
            continue
        metrics = final.reward_metrics
        rows.append(
            {
                "session": session,
                "samples": len(mine),
                "tool_calls": metrics.get("rollout/tool_calls", 0.0),
                "score": final.score,
                "loss_mask": final.loss_mask,
                "correct_metric": metrics.get("rollout/correct"),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4, help="rollouts per task")
    parser.add_argument("--concurrency", type=int, default=8, help="attempts at once")
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name, broker(Path(tmp_name)) as base:
        tmp = Path(tmp_name)
        settings, env = private_topics(base, "calc")
        with stack(env, tmp, args.threads) as proxy:
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", "rollout", "run", "--processor", PROCESSOR,
                 "--tasks", str(TASKS), "--n", str(args.n), "--concurrency", str(args.concurrency),
                 "--model-url", proxy + "/v1", "--model-name", "smollm2-135m-instruct",
                 "--max-attempts", "1"],
                env=env, capture_output=True, text=True, cwd=REPO,
            )  # fmt: skip
            stage_s = time.monotonic() - started
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            samples = all_scored(settings, 600)
    rows = rollouts_of(samples)
    n = len(rows)
    agree = sum(r["score"] == r["correct_metric"] for r in rows)
    result = {
        "rollout_run": summary,
        "exit": done.returncode,
        "stage_s": round(stage_s, 1),
        "rollouts_per_s": round(summary["rollouts"] / stage_s, 3),
        "trained_rollouts": n,
        "called_tool": round(sum(r["tool_calls"] > 0 for r in rows) / max(n, 1), 3),
        "scored_correct": round(sum(r["score"] for r in rows) / max(n, 1), 3),
        "score_equals_correct_metric": f"{agree}/{n}",
        "samples": len(samples),
        "excluded_rollout_failed": sum(s.exclude_reason == "rollout_failed" for s in samples),
        "samples_per_rollout": round(sum(r["samples"] for r in rows) / max(n, 1), 2),
        "rollouts": rows,
    }
    print("| rollouts ok | called tool | scored correct | score = own metric | samples | s |")
    print("|---|---|---|---|---|---|")
    ok = f"{summary['rollouts']}/{summary['tasks'] * args.n}"
    print(f"| {ok} | {result['called_tool']} | {result['scored_correct']} | {agree}/{n} | "
          f"{len(samples)} | {result['stage_s']} |")  # fmt: skip
    write_result("calculator_stack", {"n": args.n, "concurrency": args.concurrency, **result})


if __name__ == "__main__":
    main()
