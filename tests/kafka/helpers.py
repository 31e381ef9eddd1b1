"""What the Kafka-tier tests share: reading topics back, the CLI as a user runs it, processes."""

from __future__ import annotations

import os
import subprocess
import sys

from kafka.admin import NewTopic
from kafka.partitioner.default import murmur2

from pipeline.broker.clients import admin_client
from pipeline.broker.reading import read_to_end
from pipeline.settings import Settings


def read_all(settings: Settings, topic: str, timeout_s: float = 20.0) -> list:
    """Every record of ``topic`` from the beginning up to its current end, in offset order
    within each partition: :func:`pipeline.broker.reading.read_to_end`, which raises a
    BrokerError naming the topic when it does not exist, or naming each partition short of
    its end when ``timeout_s`` passes first."""
    return read_to_end(settings, topic, timeout_s=timeout_s)


def partition_of(settings: Settings, session: str) -> int:
    """The partition of chat.turns ``session``'s events go to (producers key by session id)."""
    return (murmur2(session.encode()) & 0x7FFFFFFF) % settings.topics.chat_turns.partitions


def session_on(settings: Settings, partition: int, name: str) -> str:
    """A session id ``name``N whose events go to ``partition`` of chat.turns: a marker that
    comes after another session's events in that partition's order."""
    return next(
        f"{name}{i}" for i in range(1000) if partition_of(settings, f"{name}{i}") == partition
    )


def turnstream(
    *args: str, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess:
    """Run the `turnstream` CLI as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        env={**env, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn(
    args: list[str],
    log: os.PathLike[str] | str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``python -m ARGS`` in its own process group, output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", *args],
            env={**(env or os.environ), "PYTHONPATH": os.getcwd()},
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Wait until ``url`` answers (any status); fail if ``proc`` exits first."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before {url} answered")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:.0f}s")


def make_topic(settings: Settings, name: str, partitions: int) -> str:
    """Create ``settings.topic_prefix + name`` with ``partitions``; its full name."""
    topic = settings.topic_prefix + name
    client = admin_client(settings)
    try:
        client.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        client.close()
    return topic
