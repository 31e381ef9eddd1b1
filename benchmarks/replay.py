"""Replay rate: `turnstream replay` copying a topic vs kcat copying and reading it.

Fills a source topic with N chat events (8 partitions, ~0.5 KB each), then
times (wall clock, whole command) `kcat -C -e` reading it to /dev/null, a kcat
copy pipe (`kcat -C` printing key and value | `kcat -P` with keys, acks=all,
idempotent: the same producer settings as replay's) into an empty topic, and
`turnstream replay` copying all of it into another empty topic (reading,
writing, and the replay-id check of the target). Both copies use the codec of
--compression (none by default: the clients, not zlib, are compared). The copy
pipe is the like-for-like peer; the read alone bounds both. Prints a table and
writes benchmarks/results/replay.json.

    python benchmarks/replay.py [--events 100000] [--compression none]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import broker, cli_env, write_result
from kafka import KafkaProducer
from kafka.admin import NewTopic

from pipeline.broker.clients import admin_client
from pipeline.settings import Settings


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


def kcat_copy(bootstrap: str, source: str, target: str, codec: str) -> float:
    """`kcat -C ... | kcat -P ...`: key and value through a pipe, as fast as kcat copies."""
    read = ["kcat", "-C", "-b", bootstrap, "-t", source, "-e", "-q", "-o", "beginning",
            "-f", "%k\t%s\n"]  # fmt: skip
    write = ["kcat", "-P", "-b", bootstrap, "-t", target, "-K", "\t", "-z", codec,
             "-X", "acks=all", "-X", "enable.idempotence=true"]  # fmt: skip
    start = time.perf_counter()
    reader = subprocess.Popen(read, stdout=subprocess.PIPE)
    writer = subprocess.run(write, stdin=reader.stdout, capture_output=True)
    assert reader.stdout is not None
    reader.stdout.close()
    reader.wait()
    seconds = time.perf_counter() - start
    if reader.returncode or writer.returncode:
        sys.exit(f"kcat copy failed:\n{writer.stderr.decode()[-2000:]}")
    return seconds


def run(settings: Settings, n: int, codec: str) -> dict:
    prefix = f"bench{uuid.uuid4().hex[:6]}."
    source, target, peer = prefix + "source", prefix + "target", prefix + "kcat"
    client = admin_client(settings)
    try:
        spec = settings.topics.chat_turns  # the replicas of the settings' topics profile
        isr = {"min.insync.replicas": spec.configs.get("min.insync.replicas", "1")}
        client.create_topics(
            [
                NewTopic(t, 8, spec.replication_factor, topic_configs=isr)
                for t in (source, target, peer)
            ]
        )
    finally:
        client.close()
    fill(settings, source, n)
    env = cli_env(settings)
    bootstrap = settings.bootstrap_servers
    kcat_s, _ = timed(
        ["kcat", "-C", "-b", bootstrap, "-t", source, "-e", "-q", "-o", "beginning"], env
    )
    pipe_s = kcat_copy(bootstrap, source, peer, codec)
    replay_s, stdout = timed(
        [sys.executable, "-m", "pipeline.cli", "replay", "--from", source, "--to", target],
        {**env, "TURNSTREAM_PRODUCER_COMPRESSION": codec},
    )
    copied = int(re.search(r"copied (\d+)", stdout).group(1))  # type: ignore[union-attr]
    inner = float(re.search(r"\(([\d,]+) records/s\)", stdout).group(1).replace(",", ""))  # type: ignore[union-attr]
    return {
        "events": n,
        "compression": codec,
        "copied": copied,
        "kcat_read_s": round(kcat_s, 2),
        "kcat_read_per_s": round(n / kcat_s),
        "kcat_copy_s": round(pipe_s, 2),
        "kcat_copy_per_s": round(n / pipe_s),
        "replay_s": round(replay_s, 2),
        "replay_per_s": round(n / replay_s),
        "replay_copy_loop_per_s": round(inner),
        "ratio_replay_over_kcat": round((n / replay_s) / (n / kcat_s), 3),
        "ratio_replay_over_kcat_copy": round(pipe_s / replay_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--compression", default="none", choices=["none", "gzip", "lz4", "zstd"])
    args = parser.parse_args()
    if shutil.which("kcat") is None:
        sys.exit("kcat is not installed (apt-get install kcat)")
    with tempfile.TemporaryDirectory() as tmp, broker(Path(tmp)) as settings:
        result = run(settings, args.events, args.compression)
    write_result("replay", result)
    print(f"\n{'client':<28}{'events':>10}{'seconds':>10}{'events/s':>12}")
    print(f"{'kcat -C (read only)':<28}{args.events:>10}{result['kcat_read_s']:>10}"
          f"{result['kcat_read_per_s']:>12}")  # fmt: skip
    print(f"{'kcat -C | kcat -P (copy)':<28}{args.events:>10}{result['kcat_copy_s']:>10}"
          f"{result['kcat_copy_per_s']:>12}")  # fmt: skip
    print(f"{'turnstream replay (copy)':<28}{args.events:>10}{result['replay_s']:>10}"
          f"{result['replay_per_s']:>12}")  # fmt: skip
    print(f"copy loop alone: {result['replay_copy_loop_per_s']} records/s; ratio (replay / "
          f"kcat copy events/s): {result['ratio_replay_over_kcat_copy']}; (replay / kcat read): "
          f"{result['ratio_replay_over_kcat']}")  # fmt: skip


if __name__ == "__main__":
    main()
