"""Replay rate: `turnstream replay` copying a topic vs `kcat -C` reading the same topic.

Fills a source topic with N chat events (8 partitions, ~0.5 KB each), then
times (wall clock, whole command) `kcat -C -e` reading it to /dev/null and
`turnstream replay` copying all of it into an empty topic (reading, writing
with acks=all, and the replay-id check of the target). Replay does more work
than a read, so the ratio is a floor on how close it gets to a plain consumer.
Prints a table and writes benchmarks/results/replay.json.

    python benchmarks/replay.py [--events 100000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import broker, write_result
from kafka import KafkaProducer
from kafka.admin import NewTopic

from pipeline.broker.clients import admin_client
from pipeline.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def fill(settings: Settings, topic: str, n: int) -> None:
    out = KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, linger_ms=20, batch_size=256 * 1024
    )
    body = b'{"type":"message","session_id":"s%06d","ts":1.0,"message":{"role":"user","content":"'
    for i in range(n):
        value = body % (i % 5000) + b"x" * 400 + b'"}}'
        out.send(topic, key=b"s%06d" % (i % 5000), value=value, headers=[("bench", b"1")])
    out.flush()
    out.close()


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{proc.stderr[-2000:]}")
    return seconds, proc.stdout


def run(settings: Settings, n: int) -> dict:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    source, target = prefix + "source", prefix + "target"
    client = admin_client(settings)
    try:
        client.create_topics([NewTopic(source, 8, 1), NewTopic(target, 8, 1)])
    finally:
        client.close()
    fill(settings, source, n)
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers}
    kcat_s, _ = timed(
        [
            "kcat",
            "-C",
            "-b",
            settings.bootstrap_servers,
            "-t",
            source,
            "-e",
            "-q",
            "-o",
            "beginning",
        ],
        env,
    )
    replay_s, stdout = timed(
        [sys.executable, "-m", "pipeline.cli", "replay", "--from", source, "--to", target],
        {**env, "PYTHONPATH": str(REPO)},
    )
    copied = int(re.search(r"copied (\d+)", stdout).group(1))  # type: ignore[union-attr]
    inner = float(re.search(r"\(([\d,]+) records/s\)", stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    return {
        "events": n,
        "copied": copied,
        "kcat_read_s": round(kcat_s, 2),
        "kcat_read_per_s": round(n / kcat_s),
        "replay_s": round(replay_s, 2),
        "replay_per_s": round(n / replay_s),
        "replay_copy_loop_per_s": round(inner),
        "ratio_replay_over_kcat": round((n / replay_s) / (n / kcat_s), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    if shutil.which("kcat") is None:
        sys.exit("kcat is not installed (apt-get install kcat)")
    with tempfile.TemporaryDirectory() as tmp, broker(Path(tmp)) as settings:
        result = run(settings, args.events)
    write_result("replay", result)
    print(f"\n{'client':<28}{'events':>10}{'seconds':>10}{'events/s':>12}")
    print(f"{'kcat -C (read only)':<28}{args.events:>10}{result['kcat_read_s']:>10}"
          f"{result['kcat_read_per_s']:>12}")  # fmt: skip
    print(f"{'turnstream replay (copy)':<28}{args.events:>10}{result['replay_s']:>10}"
          f"{result['replay_per_s']:>12}")  # fmt: skip
    print(f"copy loop alone: {result['replay_copy_loop_per_s']} records/s; "
          f"ratio (replay / kcat events/s): {result['ratio_replay_over_kcat']}")  # fmt: skip


if __name__ == "__main__":
    main()
