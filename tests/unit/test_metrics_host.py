"""The scoring worker and the trainer serve /metrics on the address they are given."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from pipeline.broker.local import free_port_pair
from pipeline.scoring import metrics
from pipeline.settings import Settings
from pipeline.training.config import TrainerConfig
from pipeline.training.trainer import Trainer


@pytest.fixture
def other_loopback() -> str:
    """A local address other than 127.0.0.1 (Linux routes all of 127/8 to loopback)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.2", 0))
        except OSError:
            pytest.skip("127.0.0.2 is not a local address on this system")
    return "127.0.0.2"


def scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_worker_metrics_listen_on_the_given_host_only(other_loopback: str) -> None:
    port = free_port_pair()
    served = metrics.serve(port, other_loopback)
    assert served is not None
    try:
        assert "turnstream_pairing_events_total" in scrape(other_loopback, port)
        assert refuses("127.0.0.1", port)
    finally:
        served[0].shutdown()
        served[0].server_close()
    assert metrics.serve(0, other_loopback) is None  # port 0: not served


def test_worker_metrics_default_to_127_0_0_1(other_loopback: str) -> None:
    port = free_port_pair()
    served = metrics.serve(port)
    assert served is not None
    try:
        assert "turnstream_pairing_events_total" in scrape("127.0.0.1", port)
        assert refuses(other_loopback, port)
    finally:
        served[0].shutdown()
        served[0].server_close()


def test_trainer_metrics_listen_on_metrics_host(tmp_path: Path, other_loopback: str) -> None:
    port = free_port_pair()
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        metrics_jsonl=None,
        metrics_host=other_loopback,
        metrics_port=port,
    )
    trainer = Trainer(Settings(), config, engine=None, tokenizer=None)
    server = trainer.sink.server
    assert server is not None
    try:
        assert "turnstream_trainer_loss" in scrape(other_loopback, port)
        assert refuses("127.0.0.1", port)
    finally:
        server[0].shutdown()
        server[0].server_close()
