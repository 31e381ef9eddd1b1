"""The trained judge, served on CPU: throughput, tokens and latency per scored pair.

The default judge (smollm2-135m-judge) is served in this process by `turnstream
serve`'s engine, and the same held-out pairs are judged three ways, m=3 votes
each, majority vote:

  constrained  the worker's default with a trained judge: one /generate request per
               pair, n=3, regex-constrained (a box within a few tokens)
  free-256     the same request without the regex, 256 new tokens a vote at most
  openclaw     OpenClaw-RL's scheme: three separate /generate requests per pair,
               free, 256 new tokens a vote at most (theirs is 4,096 with a 4B judge)

Prints a table (pairs/s, prompt tokens sent, prefilled (the server's work: n votes
share one prefill) and generated tokens per pair, p50/p99 latency per
pair, votes without a score, Cohen kappa against the gold labels) and the ratios
against constrained; writes benchmarks/results/judge.json.

    python benchmarks/judge.py [--pairs 60] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.judge.asking import eval_votes
from pipeline.judge.client import JudgeClient, JudgeConfig
from pipeline.judge.prompts import render_content
from pipeline.judge.votes import majority_vote
from pipeline.judge_model.build import ensure_judge
from pipeline.rewards.agreement import agreement, load_gold
from pipeline.rewards.types import response_text
from pipeline.serving.run import open_state, serving_in_thread
from pipeline.settings import ServeSettings

RESULTS = Path(__file__).resolve().parent / "results"
HELDOUT = Path(__file__).resolve().parent.parent / "examples" / "judge" / "heldout.jsonl"


class CountingClient(JudgeClient):
    """A judge client that adds up the tokens the server reports for each answer."""

    prompt_tokens = 0
    generated_tokens = 0

    async def post(self, path: str, body: dict[str, Any] | None) -> Any:
        data = await super().post(path, body)
        for answer in data if isinstance(data, list) else [data]:
            meta = answer.get("meta_info", {}) if isinstance(answer, dict) else {}
            self.prompt_tokens += int(meta.get("prompt_tokens", 0))
            self.generated_tokens += int(meta.get("completion_tokens", 0))
        return data


async def judge_pairs(
    url: str,
    scheme: str,
    pairs: list[tuple[str, str, str]],
    concurrency: int,
    prefilled: Callable[[], int],
) -> dict[str, Any]:
    config = JudgeConfig(
        backend="sglang",
        urls=[url],
        max_new_tokens=256,
        constrained="on" if scheme == "constrained" else "off",
        batch_max=1,  # one request per pair (per vote for openclaw), as asked
    )
    limit = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    scores: list[float] = [0.0] * len(pairs)  # in the pairs' order, whatever ends first
    failed_votes = 0
    prefilled_before = prefilled()
    async with CountingClient(config) as client:

        async def one(index: int, pair: tuple[str, str, str]) -> None:
            nonlocal failed_votes
            async with limit:
                started = time.perf_counter()
                if scheme == "openclaw":  # three separate requests, asked at once
                    parts = await asyncio.gather(
                        *(eval_votes(client, *pair, m=1) for _ in range(3))
                    )
                    votes = [v for p in parts for v in p.votes]
                    score = majority_vote(votes)
                else:
                    result = await eval_votes(client, *pair, m=3)
                    votes, score = result.votes, result.score
                latencies.append(time.perf_counter() - started)
                scores[index] = float(score)
                failed_votes += sum(v is None for v in votes)

        started = time.perf_counter()
        await asyncio.gather(*(one(i, p) for i, p in enumerate(pairs)))
        wall = time.perf_counter() - started
        prompt, generated = client.prompt_tokens, client.generated_tokens
    ordered = sorted(latencies)
    return {
        "pairs": len(pairs),
        "wall_s": round(wall, 1),
        "pairs_per_s": round(len(pairs) / wall, 3),
        "prompt_tokens_per_pair": round(prompt / len(pairs), 1),
        "prefilled_tokens_per_pair": round((prefilled() - prefilled_before) / len(pairs), 1),
        "generated_tokens_per_pair": round(generated / len(pairs), 1),
        "latency_p50_s": round(statistics.median(ordered), 2),
        "latency_p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "failed_votes": failed_votes,
        "scores": scores,
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    heads = ["scheme", "pairs/s", "prompt tok/pair", "prefilled/pair", "gen tok/pair", "p50 s",
             "p99 s",
             "no-score votes", "kappa"]  # fmt: skip
    lines = [" | ".join(heads), " | ".join("---" for _ in heads)]
    for name, r in rows.items():
        cells = [name, r["pairs_per_s"], r["prompt_tokens_per_pair"],
                 r["prefilled_tokens_per_pair"],
                 r["generated_tokens_per_pair"], r["latency_p50_s"], r["latency_p99_s"],
                 r["failed_votes"], r["kappa"]]  # fmt: skip
        lines.append(" | ".join(str(c) for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=60, help="held-out pairs judged per scheme")
    parser.add_argument("--concurrency", type=int, default=8, help="pairs judged at once")
    args = parser.parse_args()
    judge_dir = ensure_judge(log=print)
    items = load_gold(HELDOUT)
    items = random.Random(0).sample(items, min(args.pairs, len(items)))  # every kind of pair
    pairs = [
        (
            response_text(i.input),
            i.input.next_state.role,
            render_content(i.input.next_state.content),
        )
        for i in items
        if i.input.next_state is not None
    ]
    labels = [i.label for i in items]
    state = open_state(ServeSettings(model=str(judge_dir)))

    def prefill_counter() -> int:
        return int(state.engine.load()["prefill_tokens"])

    rows: dict[str, dict[str, Any]] = {}
    try:
        with serving_in_thread(state) as url:
            for scheme in ("constrained", "free-256", "openclaw"):
                row = asyncio.run(
                    judge_pairs(url, scheme, pairs, args.concurrency, prefill_counter)
                )
                row["kappa"] = agreement(labels, row.pop("scores")).kappa
                row["kappa"] = None if row["kappa"] is None else round(row["kappa"], 3)
                rows[scheme] = row
                print(f"{scheme}: {row}", flush=True)
    finally:
        state.engine.stop()
    base = rows["constrained"]
    ratios = {
        name: {
            "pairs_per_s": round(r["pairs_per_s"] / base["pairs_per_s"], 3),
            "tokens_per_pair": round(
                (r["prefilled_tokens_per_pair"] + r["generated_tokens_per_pair"])
                / (base["prefilled_tokens_per_pair"] + base["generated_tokens_per_pair"]),
                3,
            ),
        }
        for name, r in rows.items()
    }
    print(table(rows))
    print("ratios against constrained:", json.dumps(ratios))
    RESULTS.mkdir(exist_ok=True)
    out = {"judge": judge_dir.name, "rows": rows, "ratios": ratios, "concurrency": args.concurrency}
    (RESULTS / "judge.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
