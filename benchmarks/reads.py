"""Range reads alone: the shared range reader and the trainer's range source vs `kcat -C`.

Fills a topic with N records (8 partitions, ~0.5 KB each, as benchmarks/replay.py
does), then times reading all of it, nothing else done with the records:

- `kcat -C -e` to /dev/null (whole command, wall clock);
- the shared range reader (``pipeline.broker.reading.read_range``): what `turnstream
  rescore`, `turnstream replay` and the scoring guard read with;
- the trainer's range source (``RangeSource``, `turnstream train --from-topic`):
  the same reader in a thread, partition after partition, polled as the trainer
  polls, without the model step.

Each in-process figure includes starting its client. Prints a table and writes
benchmarks/results/reads.json.

    python benchmarks/reads.py [--events 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from common import broker, partition_ends, write_result
from kafka.admin import NewTopic
from replay import fill

from pipeline.broker.bulk import range_consumer
from pipeline.broker.clients import admin_client
from pipeline.broker.reading import TopicRange, read_range
from pipeline.settings import Settings
from pipeline.training.sources import RangeSource


def kcat_read(settings: Settings, topic: str) -> float:
    cmd = ["kcat", "-C", "-b", settings.bootstrap_servers, "-t", topic, "-e", "-q",
           "-o", "beginning"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode:
        sys.exit(f"kcat failed:\n{proc.stderr.decode()[-2000:]}")
    return time.perf_counter() - start


def reader_read(settings: Settings, span: TopicRange) -> tuple[float, int]:
    async def read() -> int:
        got = 0
        async with range_consumer(settings) as consumer:
            async for fetched in read_range(consumer, span):
                got += sum(len(records) for records in fetched.values())
        return got

    start = time.perf_counter()
    n = asyncio.run(read())
    return time.perf_counter() - start, n


def source_read(settings: Settings, span: TopicRange) -> tuple[float, int]:
    start = time.perf_counter()
    source = RangeSource(settings, f"bench-reads-{uuid.uuid4().hex[:6]}", span, {})
    source.open()
    n = 0
    try:
        while not source.at_end():
            for rec in source.poll(500):
                source.passed(rec)
                n += 1
    finally:
        source.close()
    return time.perf_counter() - start, n


def run(settings: Settings, n: int) -> dict:
    topic = f"bench{uuid.uuid4().hex[:6]}.reads"
    client = admin_client(settings)
    try:
        client.create_topics([NewTopic(topic, 8, 1)])
    finally:
        client.close()
    fill(settings, topic, n)
    span = TopicRange(topic, {p: (0, end) for p, end in partition_ends(settings, topic).items()})
    kcat_s = kcat_read(settings, topic)
    reader_s, got_reader = reader_read(settings, span)
    source_s, got_source = source_read(settings, span)
    if (got_reader, got_source) != (n, n):
        sys.exit(f"expected {n} records, read_range gave {got_reader}, RangeSource {got_source}")
    return {
        "events": n,
        "kcat_read_s": round(kcat_s, 2),
        "kcat_read_per_s": round(n / kcat_s),
        "read_range_s": round(reader_s, 2),
        "read_range_per_s": round(n / reader_s),
        "range_source_s": round(source_s, 2),
        "range_source_per_s": round(n / source_s),
        "ratio_read_range_over_kcat": round(kcat_s / reader_s, 3),
        "ratio_range_source_over_kcat": round(kcat_s / source_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    if shutil.which("kcat") is None:
        sys.exit("kcat is not installed (apt-get install kcat)")
    with tempfile.TemporaryDirectory() as tmp, broker(Path(tmp)) as settings:
        r = run(settings, args.events)
    write_result("reads", r)
    print(f"\n{'reader':<44}{'records':>10}{'seconds':>10}{'records/s':>12}{'ratio':>8}")
    rows = [
        ("kcat -C (read only)", "kcat_read", None),
        ("read_range (rescore, replay, scoring guard)", "read_range", "ratio_read_range_over_kcat"),
        ("RangeSource (train --from-topic)", "range_source", "ratio_range_source_over_kcat"),
    ]
    for label, key, ratio in rows:
        shown = "" if ratio is None else f"{r[ratio]:>8}"
        print(f"{label:<44}{args.events:>10}{r[key + '_s']:>10}{r[key + '_per_s']:>12}{shown}")


if __name__ == "__main__":
    main()
