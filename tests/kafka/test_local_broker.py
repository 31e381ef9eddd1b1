"""`turnstream kafka start|stop|status` on brokers of their own (not the session one)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from pipeline.broker.local import LocalKafka, _alive
from pipeline.errors import BrokerError
from pipeline.settings import LocalKafkaSettings
from tests.conftest import free_port_pair
from tests.kafka.helpers import turnstream


def _env(port: int, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
    env.update(TURNSTREAM_KAFKA_PORT=str(port), TURNSTREAM_KAFKA_DATA_DIR=str(data_dir))
    return env


def test_cli_start_is_idempotent_status_and_stop(tmp_path: Path) -> None:
    env = _env(free_port_pair(), tmp_path / "kafka")
    try:
        first = turnstream("kafka", "start", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "Kafka ready at" in first.stdout
        pid = int((tmp_path / "kafka" / "broker.pid").read_text())
        again = turnstream("kafka", "start", env=env)
        assert again.returncode == 0
        assert "already running" in again.stdout and str(pid) in again.stdout
        status = turnstream("kafka", "status", env=env)
        assert status.returncode == 0
        assert f"pid {pid}" in status.stdout and "topics (0): none" in status.stdout
    finally:
        stop = turnstream("kafka", "stop", env=env)
    assert stop.returncode == 0 and "Kafka stopped" in stop.stdout
    assert not _alive(pid)
    status = turnstream("kafka", "status", env=env)
    assert status.returncode == 3 and "not running" in status.stdout


def test_stop_touches_only_the_process_it_started(tmp_path: Path) -> None:
    local = LocalKafka(LocalKafkaSettings(port=free_port_pair(), data_dir=tmp_path))
    tmp_path.mkdir(exist_ok=True)
    local.pid_file.write_text(str(os.getpid()))  # a pid that is not our broker
    assert local.pid() is None
    assert local.stop() is False
    os.kill(os.getpid(), 0)  # still alive
    assert not local.pid_file.exists()


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        local = LocalKafka(LocalKafkaSettings(port=port, data_dir=tmp_path))
        with pytest.raises(BrokerError, match=f"127.0.0.1:{port} is already in use"):
            local.start()


def test_broker_that_dies_while_starting_shows_its_log(tmp_path: Path) -> None:
    data = tmp_path / "kafka" / "data"
    data.mkdir(parents=True)
    # Storage that belongs to another node: the broker refuses it and exits.
    (data / "meta.properties").write_text(
        "version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=42\n"
        "directory.id=AAAAAAAAAAAAAAAAAAAAAA\n"
    )
    result = turnstream("kafka", "start", env=_env(free_port_pair(), tmp_path / "kafka"))
    assert result.returncode == 1
    assert "Kafka exited with code" in result.stderr
    assert "last lines of" in result.stderr
    assert not (tmp_path / "kafka" / "broker.pid").exists()


def test_bad_jvm_option_fails_with_the_jvm_message(tmp_path: Path) -> None:
    env = {**_env(free_port_pair(), tmp_path / "kafka"), "TURNSTREAM_KAFKA_HEAP": "1Q"}
    result = turnstream("kafka", "start", env=env)
    assert result.returncode == 1
    assert "formatting Kafka storage" in result.stderr
    assert "Invalid maximum heap size: -Xmx1Q" in result.stderr


def test_cli_refuses_to_manage_a_configured_cluster(tmp_path: Path) -> None:
    env = {**_env(free_port_pair(), tmp_path), "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    result = turnstream("kafka", "start", env=env)
    assert result.returncode == 1
    assert "KAFKA_BOOTSTRAP_SERVERS" in result.stderr
    assert not (tmp_path / "broker.pid").exists()
