"""What the Kafka benchmarks share: a broker to run against and where results go."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.broker.local import LocalKafka, free_port_pair
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings, load_settings

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``python -m ARGS`` in its own process group, output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            env={**env, "PYTHONPATH": str(REPO)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_http(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{url} did not answer within 60s")


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
