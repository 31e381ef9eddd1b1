"""Producer throughput: `turnstream produce` vs `kcat -P` on the same event file.

Both send the same N input events (key = session_id, acks=all, idempotent,
the codec of --compression: gzip by default) to fresh topics on the same
broker; the time is wall-clock for the whole command, including turnstream's
validation pass. gzip is at zlib's default level 6 on both sides (librdkafka's
default, and TURNSTREAM_PRODUCER_GZIP_LEVEL's; the Python clients alone would
use 9, several times slower); ``--compression none`` compares the clients
without zlib. Prints a table and writes benchmarks/results/produce.json.

    python benchmarks/produce.py [--events 100000] [--compression gzip]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from common import broker, cli_env, write_result

from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets

WORDS = [
    "the",
    "agent",
    "ran",
    "a",
    "tool",
    "and",
    "read",
    "the",
    "output",
    "then",
    "answered",
    "the",
    "user",
    "about",
    "files",
    "tests",
]


def write_events(path: Path, kcat_path: Path, n: int, seed: int = 1) -> None:
    """N turn/message events over n/8 sessions, as JSONL and as kcat's key<TAB>value."""
    rng = random.Random(seed)
    sessions = max(1, n // 8)
    with open(path, "wb") as plain, open(kcat_path, "wb") as keyed:
        for i in range(n):
            session = f"bench-{i % sessions:06d}"
            index = i // sessions
            text = " ".join(rng.choices(WORDS, k=rng.randint(20, 120)))
            if index % 2 == 0:
                event = {
                    "type": "turn",
                    "session_id": session,
                    "turn_index": index,
                    "turn_type": "main",
                    "ts": 1790000000.0 + i,
                    "messages": [
                        {"role": "system", "content": "You are an agent."},
                        {"role": "user", "content": text},
                    ],
                    "response": {"content": text[::-1]},
                }
            else:
                event = {
                    "type": "message",
                    "session_id": session,
                    "ts": 1790000000.0 + i,
                    "message": {"role": "user", "content": text},
                }
            line = orjson.dumps(event)
            plain.write(line + b"\n")
            keyed.write(session.encode() + b"\t" + line + b"\n")


def timed(cmd: list[str], env: dict[str, str], stdin_path: Path | None = None) -> float:
    start = time.perf_counter()
    with open(stdin_path, "rb") if stdin_path else open(os.devnull, "rb") as stdin:
        proc = subprocess.run(cmd, env=env, stdin=stdin, capture_output=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    return elapsed


def run(settings: Settings, n: int, workdir: Path, codec: str) -> dict:
    events, keyed = workdir / "events.jsonl", workdir / "events.kcat"
    write_events(events, keyed, n)
    run_id = uuid.uuid4().hex[:6]
    ours = settings.model_copy(update={"topic_prefix": f"bench-{run_id}-ts."})
    theirs = settings.model_copy(update={"topic_prefix": f"bench-{run_id}-kcat."})
    admin.apply(ours)
    admin.apply(theirs)
    env = cli_env(ours, TURNSTREAM_PRODUCER_COMPRESSION=codec)
    turnstream = [sys.executable, "-m", "pipeline.cli", "produce", str(events)]
    kcat = [
        shutil.which("kcat") or "kcat",
        "-P",
        "-b",
        settings.bootstrap_servers,
        "-t",
        theirs.topics.chat_turns.name,
        "-K",
        "\t",
        "-z",
        codec,
        "-X",
        "acks=all",
        "-X",
        "enable.idempotence=true",
    ]
    t_ours = timed(turnstream, env)
    t_kcat = timed(kcat, env, stdin_path=keyed)
    got_ours = end_offsets(ours, [ours.topics.chat_turns.name])[ours.topics.chat_turns.name]
    got_kcat = end_offsets(theirs, [theirs.topics.chat_turns.name])[theirs.topics.chat_turns.name]
    if (got_ours, got_kcat) != (n, n):
        sys.exit(f"expected {n} records on each topic, got turnstream={got_ours} kcat={got_kcat}")
    return {
        "events": n,
        "compression": codec,
        "gzip_level": settings.producer_gzip_level,
        "file_bytes": events.stat().st_size,
        "turnstream_produce_s": round(t_ours, 3),
        "turnstream_events_per_s": round(n / t_ours),
        "kcat_s": round(t_kcat, 3),
        "kcat_events_per_s": round(n / t_kcat),
        "ratio_turnstream_over_kcat": round(t_kcat / t_ours, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--compression", default="gzip", choices=["none", "gzip", "lz4", "zstd"])
    args = parser.parse_args()
    if shutil.which("kcat") is None:
        sys.exit("kcat is not installed (apt-get install kcat)")
    with tempfile.TemporaryDirectory() as tmp, broker(Path(tmp)) as settings:
        result = run(settings, args.events, Path(tmp), args.compression)
    write_result("produce", result)
    print(f"\n{'client':<22}{'events':>10}{'seconds':>10}{'events/s':>12}")
    print(
        f"{'turnstream produce':<22}{result['events']:>10}{result['turnstream_produce_s']:>10}"
        f"{result['turnstream_events_per_s']:>12}"
    )
    print(
        f"{'kcat -P':<22}{result['events']:>10}{result['kcat_s']:>10}"
        f"{result['kcat_events_per_s']:>12}"
    )
    print(f"ratio (turnstream / kcat events/s): {result['ratio_turnstream_over_kcat']}")


if __name__ == "__main__":
    main()
