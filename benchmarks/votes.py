"""Judge calls per scored turn: fixed m=3 vs early stop, on the judge simulator.

For each per-call agreement level, the same turns are judged over real HTTP by
the simulator (a test double) in both vote modes, and the call counts are
compared. Label equality is checked on identical vote sequences: each
sequence of three votes the simulator produced in fixed mode is fed, by a
scripted judge client, to the production early-stop path (``eval_votes``)
and its score compared with the majority of all three.
Prints a table and writes benchmarks/results/votes.json.

    python benchmarks/votes.py [--turns 2000] [--agreement 0.6 0.8 0.95]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
from pathlib import Path

from aiohttp.test_utils import TestServer

from pipeline.judge.asking import eval_votes
from pipeline.judge.client import JudgeClient, JudgeConfig
from pipeline.judge.votes import majority_vote
from pipeline.testing.judge_sim import JudgeSimulator, SimConfig
from pipeline.testing.scripted_judge import ScriptedJudgeClient

RESULTS = Path(__file__).resolve().parent / "results"


async def measure(agreement: float, turns: int) -> dict[str, float]:
    sim = JudgeSimulator(SimConfig(agreement=agreement, seed=5))
    server = TestServer(sim.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    calls: dict[str, int] = {}
    sequences: list[list[int | None]] = []
    try:
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            for mode in ("fixed", "early_stop"):
                results = await asyncio.gather(
                    *(
                        eval_votes(client, f"answer {i}", "user", f"reply {i}", m=3, vote_mode=mode)  # type: ignore[arg-type]
                        for i in range(turns)
                    )
                )
                calls[mode] = sum(r.judge_calls for r in results)
                if mode == "fixed":
                    sequences = [r.votes for r in results]
    finally:
        await server.close()
    differences, early_calls = 0, 0
    for seq in sequences:
        replayed = await eval_votes(
            ScriptedJudgeClient(seq),  # type: ignore[arg-type]
            "answer",
            "user",
            "reply",
            m=3,
            vote_mode="early_stop",
        )
        differences += replayed.score != majority_vote(seq)
        early_calls += replayed.judge_calls
    return {
        "agreement": agreement,
        "turns": turns,
        "calls_per_turn_fixed": round(calls["fixed"] / turns, 3),
        "calls_per_turn_early_stop": round(calls["early_stop"] / turns, 3),
        "calls_per_turn_early_stop_on_fixed_sequences": round(early_calls / turns, 3),
        "label_differences_on_identical_sequences": differences,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--agreement", type=float, nargs="+", default=[0.6, 0.8, 0.95])
    args = parser.parse_args()
    rows = [asyncio.run(measure(a, args.turns)) for a in args.agreement]
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "votes.json").write_text(
        json.dumps({"cores": os.cpu_count(), "commit": commit, "rows": rows}, indent=2) + "\n"
    )
    print(f"\n{'agreement':>9} {'turns':>6} {'fixed':>7} {'early_stop':>11} {'label diffs':>12}")
    for r in rows:
        print(
            f"{r['agreement']:>9} {r['turns']:>6} {r['calls_per_turn_fixed']:>7} "
            f"{r['calls_per_turn_early_stop']:>11} "
            f"{r['label_differences_on_identical_sequences']:>12}"
        )


if __name__ == "__main__":
    main()
