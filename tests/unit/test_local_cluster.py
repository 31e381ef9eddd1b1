"""A local cluster's layout: node ports, directories, quorum and replication settings, and
how the data dir's layout file steers every command's bootstrap list (no broker started)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from pipeline.broker.cluster import LocalCluster, local_broker
from pipeline.broker.local import LocalKafka, free_ports
from pipeline.errors import BrokerError
from pipeline.settings import LocalKafkaSettings


def properties(node: LocalKafka) -> dict[str, str]:
    node.write_configs()
    lines = node.properties.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_node_two_of_three_has_its_ports_directory_and_the_whole_quorum(tmp_path: Path) -> None:
    settings = LocalKafkaSettings(port=20000, data_dir=tmp_path)
    node = LocalCluster(settings, brokers=3).node(2)
    assert (node.port, node.controller, node.bootstrap) == (20002, 20003, "127.0.0.1:20002")
    assert node.data_dir == tmp_path.resolve() / "node-2"
    props = properties(node)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:20001,2@127.0.0.1:20003,3@127.0.0.1:20005"
    )
    assert "controller.quorum.bootstrap.servers" not in props
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:20002,CONTROLLER://127.0.0.1:20003"
    assert props["log.dirs"] == str(tmp_path.resolve() / "node-2" / "data")
    # the internal topics as the topics' cluster profile: three copies, two in sync
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["transaction.state.log.min.isr"] == "2"


def test_a_single_broker_keeps_its_standalone_layout(tmp_path: Path) -> None:
    local = LocalKafka(LocalKafkaSettings(port=20000, data_dir=tmp_path))
    props = properties(local)
    assert local.data_dir == tmp_path.resolve() and local.bootstrap == "127.0.0.1:20000"
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:20001"
    assert "controller.quorum.voters" not in props
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"


def test_the_layout_file_gives_every_command_the_bootstrap_list(tmp_path: Path) -> None:
    settings = LocalKafkaSettings(port=20000, data_dir=tmp_path)
    assert settings.bootstrap == "127.0.0.1:20000"
    assert isinstance(local_broker(settings), LocalKafka)
    (tmp_path / "cluster.json").write_text(json.dumps({"brokers": 3, "cluster_id": "x"}))
    assert settings.bootstrap == "127.0.0.1:20000,127.0.0.1:20002,127.0.0.1:20004"
    cluster = local_broker(settings)
    assert isinstance(cluster, LocalCluster)
    assert cluster.size == 3 and cluster.cluster_id == "x"
    assert cluster.bootstrap == settings.bootstrap
    assert {node.cluster_id for node in cluster.nodes} == {"x"}  # formatted as one cluster


def test_brokers_setting_asks_for_a_cluster_before_one_has_started(tmp_path: Path) -> None:
    settings = LocalKafkaSettings(port=20000, data_dir=tmp_path, brokers=3)
    assert settings.bootstrap.count(",") == 2
    assert isinstance(local_broker(settings), LocalCluster)


def test_a_data_dir_keeps_its_broker_count(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps({"brokers": 3, "cluster_id": "x"}))
    with pytest.raises(BrokerError, match="holds a 3-broker cluster, not 1"):
        local_broker(LocalKafkaSettings(data_dir=tmp_path), brokers=1)
    single = tmp_path / "single"
    (single / "data").mkdir(parents=True)
    (single / "data" / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(BrokerError, match="single broker's storage"):
        LocalCluster(LocalKafkaSettings(data_dir=single), brokers=3)


def test_free_ports_are_consecutive_and_bindable() -> None:
    first = free_ports(6)
    for port in range(first, first + 6):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_node_port_in_use_stops_the_cluster_before_anything_starts(tmp_path: Path) -> None:
    first = free_ports(6)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 2))  # node 2's client port
        taken.listen()
        cluster = LocalCluster(LocalKafkaSettings(port=first, data_dir=tmp_path), brokers=3)
        with pytest.raises(BrokerError, match=f"port 127.0.0.1:{first + 2} is already in use"):
            cluster.start()
    assert not cluster.running
    assert not (tmp_path / "cluster.json").exists()  # a plain `kafka start` is still free
