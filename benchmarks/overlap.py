"""Waits that overlap: the wall time of three things done at once, against one after the other.

- stopping a run's children: 3 that exit on SIGTERM and 2 that ignore it, one
  timeout (3 s) for all (``pipeline.processes.stop_processes``); a timeout each
  would take 6 s;
- a reward processor's two async sub-rewards of 0.2 s each (``run_processor``);
- a ``combine`` sample's 3 eval votes and hint vote at 1 s a call on the judge
  simulator (``score_pair``); eval votes, then the hint, would take 2 s.

The unit tests check that these overlap (the stop's deadline on a made-up clock,
sub-rewards meeting at a barrier, the simulator's calls in flight); this measures
how long they take. Prints a table and writes benchmarks/results/overlap.json.

    python benchmarks/overlap.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp.test_utils import TestServer
from common import write_result

from pipeline.events import Paired, Turn, decode_input
from pipeline.judge.asking import HttpJudge
from pipeline.judge.client import JudgeClient, JudgeConfig
from pipeline.judge.factory import judge_identity
from pipeline.processes import stop_processes
from pipeline.rewards import (
    RewardInput,
    RewardOutput,
    aggregate_func,
    reward_func,
    run_processor,
    sub_reward_func,
)
from pipeline.scoring.scorers import score_pair
from pipeline.testing.judge_sim import JudgeSimulator, SimConfig

STOP_TIMEOUT_S = 3.0
SUB_REWARD_S = 0.2
JUDGE_LATENCY_S = 1.0


def stop_children() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        ready = [Path(tmp) / f"trapped{i}" for i in range(2)]
        procs = [
            subprocess.Popen(["bash", "-c", "sleep 60"], start_new_session=True) for _ in range(3)
        ]
        procs += [
            subprocess.Popen(
                ["bash", "-c", f"trap '' TERM; touch {r}; while true; do sleep 0.1; done"],
                start_new_session=True,
            )
            for r in ready
        ]
        while not all(r.exists() for r in ready):
            time.sleep(0.02)
        started = time.monotonic()
        stop_processes(procs, timeout_s=STOP_TIMEOUT_S)  # type: ignore[arg-type]
        return time.monotonic() - started


async def sub_rewards() -> float:
    @reward_func
    class Slow:
        @sub_reward_func("a")
        async def a(self, input: RewardInput) -> RewardOutput:
            await asyncio.sleep(SUB_REWARD_S)
            return RewardOutput.success(1.0)

        @sub_reward_func("b")
        async def b(self, input: RewardInput) -> RewardOutput:
            await asyncio.sleep(SUB_REWARD_S)
            return RewardOutput.success(3.0)

        @aggregate_func
        def mean(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
            scores = self.get_scores(sub_rewards)
            return RewardOutput.success(sum(scores.values()) / len(scores))

    started = time.monotonic()
    await run_processor(Slow(), RewardInput())
    return time.monotonic() - started


def a_pair() -> Paired:
    turn = decode_input(
        b'{"type": "turn", "session_id": "s", "turn_index": 0, "turn_type": "main", "ts": 1.0,'
        b' "messages": [{"role": "user", "content": "How many lines does main.py have?"}],'
        b' "response": {"content": "main.py is about 50 lines long."}}'
    )
    assert isinstance(turn, Turn)
    return Paired(
        sample_id="s:0",
        turn=turn,
        first_judged=True,
        paired_ts=2.0,
        next_state={"role": "user", "content": "Wrong: it has 214 lines."},  # type: ignore[arg-type]
    )


async def combine_votes() -> float:
    sim = JudgeSimulator(
        SimConfig(agreement=1.0, vote_dist={1: 1.0}, latency_ms=JUDGE_LATENCY_S * 1000)
    )
    server = TestServer(sim.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            judge = HttpJudge(client, judge_identity("sglang", "sim", [url]), m=3)
            started = time.monotonic()
            await score_pair(a_pair(), judge, "combine")
            return time.monotonic() - started
    finally:
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[], float], float, float]] = [
        ("stop 5 children, 2 ignore SIGTERM", stop_children, STOP_TIMEOUT_S, 2 * STOP_TIMEOUT_S),
        ("2 sub-rewards", lambda: asyncio.run(sub_rewards()), SUB_REWARD_S, 2 * SUB_REWARD_S),
        (
            "combine: 3 eval votes + hint vote",
            lambda: asyncio.run(combine_votes()),
            JUDGE_LATENCY_S,
            2 * JUDGE_LATENCY_S,
        ),
    ]
    rows = []
    for name, measure, together_s, apart_s in cases:
        took = [measure() for _ in range(args.repeats)]
        rows.append(
            {
                "case": name,
                "together_s": together_s,
                "one_after_the_other_s": apart_s,
                "took_s": [round(t, 3) for t in took],
                "min_s": round(min(took), 3),
                "max_s": round(max(took), 3),
            }
        )
    write_result("overlap", {"repeats": args.repeats, "rows": rows})
    print(f"\n{'':34} {'together':>9} {'apart':>7} {'min':>7} {'max':>7}  (seconds)")
    for r in rows:
        print(
            f"{r['case']:34} {r['together_s']:>9.2f} {r['one_after_the_other_s']:>7.2f} "
            f"{r['min_s']:>7.3f} {r['max_s']:>7.3f}"
        )


if __name__ == "__main__":
    main()
