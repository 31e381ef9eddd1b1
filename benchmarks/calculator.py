"""The calculator rollout with the real policy: how often it calls the tool, succeeds, is right.

Every task of ``examples/rollouts/calculator_tasks.jsonl`` runs ``--n`` times
(4) through ``examples.rollouts.calculator:CalculatorRollout`` against a
`turnstream serve` of SmolLM2-135M-Instruct started here (or ``--model-url``),
at the tasks' sampling settings (temperature 1.0, at most 96 tokens a reply,
``max_turns`` 4), ``--concurrency`` rollouts at once, each as the rollout
stage runs it (``run_rollout``: within its timeout, FAILED for anything that
goes wrong). Each trajectory is scored by ``CalculatorReward``. Reported, over
all rollouts and per difficulty: the share that call the tool (a reply of
theirs writes ``CALL``), that succeed (SUCCESS), that are correct (reward
1.0), tool errors, model calls, rollouts/s and the wall time. Prints a table,
writes benchmarks/results/calculator.json.

    nice -n 19 python benchmarks/calculator.py [--n 4] [--concurrency 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import REPO, spawn, stop, wait_http, write_result

sys.path.insert(0, str(REPO))

from examples.rollouts.calculator import CalculatorRollout, parse_call
from examples.rollouts.calculator_reward import CalculatorReward
from pipeline.broker.local import free_port_pair
from pipeline.rewards import AgentOutput, RewardInput, TaskStatus
from pipeline.rollouts import RolloutInput, on_model, run_rollout
from pipeline.rollouts.tasks import read_tasks

TASKS = REPO / "examples" / "rollouts" / "calculator_tasks.jsonl"
MODEL = "smollm2-135m-instruct"


async def one_rollout(task_id: str, task: RolloutInput, gate: asyncio.Semaphore) -> dict[str, Any]:
    """One rollout of ``task`` (a fresh copy: its own trace) and what it did."""
    attempt = task.model_copy()
    async with gate:
        started = time.perf_counter()
        out = await run_rollout(CalculatorRollout(), attempt)
        seconds = time.perf_counter() - started
    replies = [str(c.response.get("content") or "") for c in attempt.trace.model_calls]
    reward = CalculatorReward().process(
        RewardInput(
            agent_output=out.agent_output if out.ok else AgentOutput(),
            ground_truth=task.ground_truth,
        )
    )
    metrics = out.agent_output.rollout_metrics or {}
    return {
        "task_id": task_id,
        "difficulty": task.rollout_extra.get("difficulty", "-"),
        "status": str(out.status),
        "error": out.error,
        "called_tool": any(parse_call(r) is not None for r in replies),
        "model_calls": len(replies),
        "tool_errors": metrics.get("tool_errors", 0.0),
        "max_turns_reached": metrics.get("max_turns_reached", 0.0),
        "reward": reward.score if out.status is TaskStatus.SUCCESS else 0.0,
        "seconds": round(seconds, 2),
        "replies": replies,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    n = len(rows)
    return {
        "rollouts": n,
        "called_tool": sum(r["called_tool"] for r in rows) / n,
        "success": sum(r["status"] == "success" for r in rows) / n,
        "correct": sum(r["reward"] for r in rows) / n,
        "correct_when_called": _mean([r["reward"] for r in rows if r["called_tool"]]),
        "correct_when_not_called": _mean([r["reward"] for r in rows if not r["called_tool"]]),
        "tool_errors_per_rollout": sum(r["tool_errors"] for r in rows) / n,
        "max_turns_reached": sum(r["max_turns_reached"] for r in rows) / n,
        "model_calls_mean": sum(r["model_calls"] for r in rows) / n,
        "rollout_s_median": statistics.median(r["seconds"] for r in rows),
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


async def run_all(tasks: dict[str, RolloutInput], n: int, concurrency: int) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    runs = [one_rollout(i, t, gate) for i, t in tasks.items() for _ in range(n)]
    return await asyncio.gather(*runs)


def print_table(groups: dict[str, dict[str, Any]]) -> None:
    print(f"{'':8} {'rollouts':>8} {'tool':>6} {'success':>8} {'correct':>8} "
          f"{'c|tool':>7} {'c|none':>7} {'tool err':>8} {'calls':>6}")  # fmt: skip
    for name, s in groups.items():
        when = [f"{v:.2f}" if v is not None else "-" for v in
                (s["correct_when_called"], s["correct_when_not_called"])]  # fmt: skip
        print(f"{name:8} {s['rollouts']:>8} {s['called_tool']:>6.2f} {s['success']:>8.2f} "
              f"{s['correct']:>8.2f} {when[0]:>7} {when[1]:>7} "
              f"{s['tool_errors_per_rollout']:>8.2f} {s['model_calls_mean']:>6.2f}")  # fmt: skip


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    tasks = {
        t.task_id: on_model(t.input, base_url=url, model_name=MODEL) for t in read_tasks(args.tasks)
    }
    started = time.perf_counter()
    rows = asyncio.run(run_all(tasks, args.n, args.concurrency))
    wall = time.perf_counter() - started
    by_level: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_level[row["difficulty"]].append(row)
    groups = {"all": summary(rows), **{k: summary(v) for k, v in by_level.items()}}
    print_table(groups)
    print(f"{len(rows)} rollouts in {wall:.1f} s: {len(rows) / wall:.2f} rollouts/s")
    return {"tasks": len(tasks), "n": args.n, "concurrency": args.concurrency,
            "wall_s": round(wall, 1), "rollouts_per_s": round(len(rows) / wall, 3),
            "summary": groups, "rollouts": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=Path, default=TASKS)
    parser.add_argument("--n", type=int, default=4, help="rollouts per task")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts at once")
    parser.add_argument("--threads", type=int, default=2, help="the server's torch threads")
    parser.add_argument("--model-url", help="a running policy server's /v1 (else one is started)")
    args = parser.parse_args()
    if args.model_url:
        result = measure(args.model_url, args)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            port, log = free_port_pair(), Path(tmp) / "serve.log"
            serve = ["pipeline.cli", "serve", "--port", str(port), "--threads", str(args.threads),
                     "--loglevel", "warning"]  # fmt: skip
            server = spawn(serve, dict(os.environ), log)
            try:
                wait_http(f"http://127.0.0.1:{port}/health", server, log)
                result = measure(f"http://127.0.0.1:{port}/v1", args)
            finally:
                stop(server)
        result["server_threads"] = args.threads
    write_result("calculator", {"model": MODEL, **result})


if __name__ == "__main__":
    main()
