"""The `cluster` tier: one three-broker cluster (three KRaft voters) for the whole session,
on ports and a data dir of its own; each test has topics of its own on it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from pipeline.broker.cluster import LocalCluster
from pipeline.broker.local import free_ports
from pipeline.settings import LocalKafkaSettings


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings = LocalKafkaSettings(
        port=free_ports(6), data_dir=tmp_path_factory.mktemp("cluster"), heap="512M"
    )
    cluster = LocalCluster(settings, brokers=3, log=lambda _msg: None)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def healthy(cluster: LocalCluster) -> LocalCluster:
    """The cluster with every node running (a test before may have left one down)."""
    for node in cluster.nodes:
        if not node.running:
            cluster.restart(node.node)
    return cluster


@pytest.fixture
def prefix() -> str:
    return f"c{uuid.uuid4().hex[:8]}."
