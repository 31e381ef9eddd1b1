"""`turnstream kafka start --brokers 3` as a user runs it: status, the cluster profile of
topics.yaml applied and planned, and stop, with no setting but the data dir and ports."""

from __future__ import annotations

import os
from pathlib import Path

from kafka.admin import ConfigResource, ConfigResourceType

from pipeline.broker.clients import admin_client
from pipeline.broker.local import free_ports
from pipeline.settings import KafkaSettings, Settings
from tests.kafka.helpers import turnstream


def topic_state(bootstrap: str, prefix: str) -> dict[str, tuple[int, str]]:
    """{topic: (replicas, min.insync.replicas)} of the topics under ``prefix``."""
    admin = admin_client(Settings(kafka=KafkaSettings(bootstrap_servers=bootstrap)))
    try:
        names = [t for t in admin.list_topics() if t.startswith(prefix)]
        replicas = {
            t["name"]: len(t["partitions"][0]["replica_nodes"])
            for t in admin.describe_topics(names)
        }
        resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        configs = admin.describe_configs(resources).get("topic", {})
    finally:
        admin.close()
    return {n: (replicas[n], configs[n]["min.insync.replicas"]["value"]) for n in names}


def test_a_three_broker_cluster_from_the_cli(tmp_path: Path) -> None:
    port = free_ports(6)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
    env.update(
        TURNSTREAM_KAFKA_DATA_DIR=str(tmp_path / "kafka"),
        TURNSTREAM_KAFKA_PORT=str(port),
        TURNSTREAM_KAFKA_HEAP="512M",
        TURNSTREAM_TOPIC_PREFIX="cli.",
    )
    bootstrap = ",".join(f"127.0.0.1:{port + 2 * n}" for n in range(3))
    try:
        started = turnstream("kafka", "start", "--brokers", "3", env=env)
        assert started.returncode == 0, started.stderr
        assert started.stdout.splitlines()[-1] == f"bootstrap: {bootstrap}"
        status = turnstream("kafka", "status", env=env)  # no --brokers: the data dir knows
        assert status.returncode == 0, status.stderr
        nodes = [line for line in status.stdout.splitlines() if line.startswith("node ")]
        assert [line.split()[2] for line in nodes] == bootstrap.split(",")
        assert all("running, pid" in line for line in nodes)
        assert sum("active controller" in line for line in nodes) == 1
        assert "3 of 3 nodes running" in status.stdout

        applied = turnstream("topics", "apply", "--profile", "cluster", env=env)
        assert applied.returncode == 0, applied.stderr
        assert bootstrap in applied.stdout  # the other commands use the list by themselves
        state = topic_state(bootstrap, "cli.")
        assert len(state) == 8 and set(state.values()) == {(3, "2")}, state
        planned = turnstream("topics", "plan", "--profile", "cluster", env=env)
        assert planned.returncode == 0 and "matches" in planned.stdout, planned.stdout

        again = turnstream("kafka", "start", env=env)
        assert again.returncode == 0 and "already running" in again.stdout
        refused = turnstream("kafka", "start", "--brokers", "1", env=env)
        assert refused.returncode != 0 and "holds a 3-broker cluster" in refused.stderr
    finally:
        stopped = turnstream("kafka", "stop", env=env, timeout=240)
    assert stopped.returncode == 0 and "Kafka cluster stopped" in stopped.stdout, stopped.stderr
    after = turnstream("kafka", "status", env=env)
    assert after.returncode == 3 and after.stdout.count("not running") == 4, after.stdout
