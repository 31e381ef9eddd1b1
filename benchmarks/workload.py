"""A seeded chat workload for the benchmarks: input events as JSON Lines.

Distributions (documented so runs can be compared):
- main turns per session: 1 + Poisson(mean_turns - 1);
- words per user message and per response: log-normal, median 24 and 40 words
  (sigma 0.6), at least 3;
- one side turn (heartbeat) after every 4th main turn;
- arrival: sessions interleaved turn by turn in a seeded random order, so
  several sessions are open at once, as under live traffic;
- every session ends with a ``session_end``.
The same seed gives byte-identical output.

    python benchmarks/workload.py --sessions 600 --out /tmp/workload.jsonl
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import orjson

WORDS = [
    "the",
    "agent",
    "ran",
    "tests",
    "read",
    "a",
    "file",
    "fixed",
    "the",
    "bug",
    "then",
    "wrote",
    "docs",
    "about",
    "kafka",
    "topics",
    "partitions",
    "offsets",
    "judge",
    "votes",
    "scores",
    "loss",
    "masks",
    "samples",
    "trainer",
    "policy",
    "weights",
]


def _poisson(rng: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _text(rng: random.Random, median: int) -> str:
    n = max(3, int(rng.lognormvariate(math.log(median), 0.6)))
    return " ".join(rng.choice(WORDS) for _ in range(n))


def generate(sessions: int, mean_turns: float = 6.0, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    per_session: list[list[dict]] = []
    for s in range(sessions):
        sid = f"w{seed}-{s:06d}"
        events: list[dict] = []
        index = 0
        for t in range(1 + _poisson(rng, mean_turns - 1)):
            events.append(
                {
                    "type": "turn",
                    "session_id": sid,
                    "turn_index": index,
                    "turn_type": "main",
                    "ts": 1.0,
                    "messages": [{"role": "user", "content": _text(rng, 24)}],
                    "response": {"content": _text(rng, 40)},
                }
            )
            index += 1
            if t % 4 == 3:
                events.append(
                    {
                        "type": "turn",
                        "session_id": sid,
                        "turn_index": index,
                        "turn_type": "side",
                        "ts": 1.0,
                        "messages": [{"role": "user", "content": "heartbeat"}],
                        "response": {"content": "HEARTBEAT_OK"},
                    }
                )
                index += 1
        events.append({"type": "session_end", "session_id": sid, "ts": 1.0})
        per_session.append(events)
    out: list[bytes] = []
    cursors = [0] * sessions
    open_sessions = list(range(sessions))
    while open_sessions:
        s = rng.choice(open_sessions)
        out.append(orjson.dumps(per_session[s][cursors[s]]))
        cursors[s] += 1
        if cursors[s] == len(per_session[s]):
            open_sessions.remove(s)
    return out


def judged_pairs(lines: list[bytes]) -> int:
    """Main turns that get a next state (the ones the judge is called for)."""
    mains: dict[str, int] = {}
    for line in lines:
        event = orjson.loads(line)
        if event["type"] == "turn" and event["turn_type"] == "main":
            mains[event["session_id"]] = mains.get(event["session_id"], 0) + 1
    return sum(n - 1 for n in mains.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--mean-turns", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lines = generate(args.sessions, args.mean_turns, args.seed)
    args.out.write_bytes(b"\n".join(lines) + b"\n")
    print(f"{len(lines)} events, {judged_pairs(lines)} judged pairs -> {args.out}")


if __name__ == "__main__":
    main()
