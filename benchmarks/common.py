"""What the Kafka benchmarks share: a broker to run against and where results go."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.broker.local import LocalKafka, free_port_pair
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings, load_settings

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def broker(tmp: Path) -> Iterator[Settings]:
    """The configured cluster, or a fresh local broker in ``tmp`` (stopped afterwards)."""
    settings = load_settings()
    if not settings.uses_local_broker:
        yield settings
        return
    local = LocalKafka(LocalKafkaSettings(port=free_port_pair(), data_dir=tmp / "kafka"))
    local.start()
    try:
        yield Settings(kafka=KafkaSettings(bootstrap_servers=local.settings.bootstrap))
    finally:
        local.stop()


def write_result(name: str, result: dict) -> dict:
    """Add the machine and commit to ``result`` and write results/NAME.json."""
    result.update(
        cores=os.cpu_count(),
        python=platform.python_version(),
        commit=subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
