"""How fast `turnstream console` serves its pages over 10,000 scored samples.

A private broker gets 10,000 samples on samples.scored across 20 policy versions (votes,
hints on some, per-token teacher log-probs on the OPD ones) and a policy.versions record
per version; a `turnstream console` reads them all (its /api/status says caught up), then
each page is fetched ``--requests`` times, one at a time, each on a new connection: the
default view, a version's lists, a sample's view, /api/versions. Prints p50 / p95 / max
per page and the console's resident memory; writes results/console.json. Goal: every
page within 1 s.

    python benchmarks/console.py [--samples 10000] [--versions 20] [--requests 30]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from common import broker, pct, spawn, stop, wait_http, write_result
from kafka import KafkaProducer

from pipeline.broker.local import free_port_pair
from pipeline.events import JudgeIdentity, Response, Sample, encode
from pipeline.settings import Settings
from pipeline.topics import admin

GOAL_S = 1.0
WORDS = ["the", "file", "config", "server", "request", "answer", "value", "error", "number",
         "list", "table", "retry", "token", "model", "version", "step", "check", "path",
         "query", "user"]  # fmt: skip
NEXT_STATES = [
    {"role": "user", "content": "Thanks, that worked!"},
    {"role": "user", "content": "No, that's wrong: the answer is 42."},
    {"role": "user", "content": "Shorter please."},
    {"role": "tool", "content": "Error: file not found"},
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def sample(i: int, version: int, rng: random.Random) -> Sample:
    """One scored sample as the worker writes it: rl, or (one in five) opd with a hint and
    per-token teacher log-probs."""
    votes: list[int | None] = [rng.choice((-1, 0, 1, 1)) for _ in range(3)]
    if rng.random() < 0.05:
        votes[2] = None  # a vote without a valid score
    valid = [v for v in votes if v is not None]
    score = float(max(set(valid), key=valid.count))
    opd = i % 5 == 0
    n_tokens = rng.randint(8, 40)
    ids = [rng.randrange(49152) for _ in range(n_tokens)]
    old = [-rng.random() * 3 for _ in ids]
    return Sample(
        sample_id=f"sess-{i}:0",
        session_id=f"sess-{i}",
        turn_index=0,
        messages=[
            {"role": "system", "content": "Answer in at most 15 words."},
            {"role": "user", "content": f"Question {i}: {text(rng, rng.randint(8, 30))}?"},
        ],
        response=Response(content=text(rng, n_tokens // 2)),
        next_state=rng.choice(NEXT_STATES),
        prompt_ids=[rng.randrange(49152) for _ in range(rng.randint(20, 60))],
        response_ids=ids,
        response_logprobs=old,
        score=score,
        votes=votes,
        judge_calls=3,
        exclude_reason=None,
        loss_mask=1,
        mode="opd" if opd else "rl",
        hint=f"Say {text(rng, 4)} first." if opd or rng.random() < 0.3 else None,
        teacher_logprobs=[o + rng.uniform(-1, 1) for o in old] if opd else None,
        policy_version=version,
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
    )


def publish(settings: Settings, n: int, versions: int) -> None:
    admin.apply(settings)
    rng = random.Random(0)
    raw = KafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=20)
    topic = settings.topics.samples_scored.name
    for i in range(n):
        s = sample(i, i * versions // n, rng)
        raw.send(topic, key=s.session_id.encode(), value=encode(s))
    for v in range(1, versions + 1):
        metrics = {"reward_mean": 0.02 * v, "teacher_gap": 0.1, "response_length": 20.0 - 0.2 * v,
                   "entropy": 2.0 - 0.03 * v, "kl": 0.002 * v}  # fmt: skip
        record = {"version": v, "path": f"/w/v{v}", "step": v, "ts": 1e9 + v,
                  "step_metrics": metrics, "push": None}  # fmt: skip
        raw.send(settings.topics.policy_versions.name, key=b"policy", value=orjson.dumps(record))
    raw.flush()
    raw.close()


def get(url: str) -> tuple[float, bytes]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        body = answer.read()
    return time.perf_counter() - began, body


def wait_caught_up(url: str, records: int, log: Path) -> float:
    began, deadline = time.monotonic(), time.monotonic() + 600
    while time.monotonic() < deadline:
        status = orjson.loads(get(url + "/api/status")[1])
        if status["records"] >= records and status["behind"] == 0:
            return time.monotonic() - began
        time.sleep(0.5)
    sys.exit(f"the console did not read {records} records within 600s:\n{log.read_text()[-2000:]}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pages(url: str, versions: int) -> dict[str, str]:
    """The pages timed: the default view, a middle version's lists, a sample's view (an OPD
    sample that version holds: its coloured tokens are the heaviest panel), /api/versions."""
    middle = versions // 2
    lists = orjson.loads(get(f"{url}/api/samples?version={middle}")[1])
    held = [s["sample_id"] for s in lists["highest"] + lists["lowest"]]
    opd = next(sid for sid in held if int(sid.split("-")[1].split(":")[0]) % 5 == 0)
    return {
        "GET / (default view)": f"{url}/",
        f"GET /?version={middle} (lists)": f"{url}/?version={middle}",
        "GET sample view (opd)": f"{url}/?version={middle}&sample={opd}",
        "GET /api/versions": f"{url}/api/versions",
    }


def time_pages(targets: dict[str, str], requests: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, target in targets.items():
        times, size = [], 0
        for _ in range(requests):
            seconds, body = get(target)
            times.append(seconds)
            size = len(body)
        out[name] = {"p50_s": round(pct(times, 0.5), 4), "p95_s": round(pct(times, 0.95), 4),
                     "max_s": round(max(times), 4), "bytes": size, "n": requests}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, broker(Path(tmp)) as base:
        settings = base.model_copy(update={"topic_prefix": "bench-console."})
        began = time.monotonic()
        publish(settings, args.samples, args.versions)
        print(f"published {args.samples} samples in {time.monotonic() - began:.1f}s")
        port, log = free_port_pair(), Path(tmp) / "console.log"
        env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
               "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix}  # fmt: skip
        proc = spawn(["pipeline.cli", "console", "--port", str(port)], env, log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/api/status", proc, log)
            read_s = wait_caught_up(url, args.samples + args.versions, log)
            results = time_pages(pages(url, args.versions), args.requests)
            rss = rss_mib(proc.pid)
        finally:
            stop(proc)
    report(args, results, read_s, rss)


def report(args: argparse.Namespace, results: dict[str, Any], read_s: float, rss: float) -> None:
    print(f"\nconsole over {args.samples} samples, {args.versions} versions; "
          f"read all in {read_s:.1f}s; RSS {rss:.0f} MiB")  # fmt: skip
    print(f"{'page':34} {'p50':>8} {'p95':>8} {'max':>8} {'bytes':>9}")
    for name, r in results.items():
        print(f"{name:34} {r['p50_s']:8.3f} {r['p95_s']:8.3f} {r['max_s']:8.3f} {r['bytes']:9d}")
    worst = max(r["max_s"] for r in results.values())
    print(f"goal: every page within {GOAL_S:.0f} s: {'met' if worst <= GOAL_S else 'MISSED'} "
          f"(slowest {worst:.3f} s)")  # fmt: skip
    write_result("console", {
        "samples": args.samples, "versions": args.versions, "requests": args.requests,
        "read_all_s": round(read_s, 1), "rss_mib": round(rss, 1), "pages": results,
        "goal_s": GOAL_S, "goal_met": worst <= GOAL_S,
    })  # fmt: skip


if __name__ == "__main__":
    main()
