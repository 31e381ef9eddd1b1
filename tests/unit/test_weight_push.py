"""The weight push against a real HTTP server: its retries, its final error, and how the
trainer counts a push that failed (apart from the samples it skipped)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import REGISTRY

from pipeline.backoff import RetryPolicy
from pipeline.settings import Settings
from pipeline.training import trainer as trainer_module
from pipeline.training.config import TrainerConfig
from pipeline.training.trainer import Trainer
from pipeline.training.weights import WeightPushError, push_to_servers

NO_WAIT = RetryPolicy(3, initial_delay_s=0.0, max_delay_s=0.0)


@pytest.fixture
def policy_server() -> Iterator[tuple[str, list[tuple[int, bytes]], list[dict]]]:
    """A server answering each POST with the next (status, body) of its script (the last
    one again when the script is spent); yields its URL, the script and the bodies it got."""
    script: list[tuple[int, bytes]] = []
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, body = script.pop(0) if len(script) > 1 else script[0]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", script, received
    finally:
        server.shutdown()
        server.server_close()


def test_a_push_is_tried_again_until_the_server_takes_the_weights(
    policy_server: tuple[str, list[tuple[int, bytes]], list[dict]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, script, received = policy_server
    script += [(503, b"loading"), (200, b'{"success": false, "message": "busy"}'), (200, b"{}")]
    push_to_servers([url], Path("/w/v000001"), NO_WAIT, weight_version="1")
    assert received == [{"model_path": "/w/v000001", "weight_version": "1"}] * 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"weight push attempt 1 failed: {url} answered 503: b'loading'",
        f"weight push attempt 2 failed: {url} refused the weights: busy",
    ]


def test_a_push_refused_every_time_fails_after_its_attempts(
    policy_server: tuple[str, list[tuple[int, bytes]], list[dict]],
) -> None:
    url, script, received = policy_server
    script.append((500, b"out of memory"))
    with pytest.raises(WeightPushError, match=r"after 3 attempts: .* answered 500"):
        push_to_servers([url], Path("/w/v000002"), NO_WAIT)
    assert len(received) == 3
    with pytest.raises(WeightPushError, match="after 1 attempts"):
        push_to_servers([url], Path("/w/v000002"), RetryPolicy(1, 0.0, 0.0))
    assert len(received) == 4


def push_failures(kind: str) -> float:
    labels = {"kind": kind}
    return REGISTRY.get_sample_value("turnstream_trainer_weight_push_failures_total", labels) or 0.0


def trainer(tmp_path: Path) -> Trainer:
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"), weights_dir=str(tmp_path / "w"), metrics_jsonl=None
    )
    module = SimpleNamespace(save_pretrained=lambda path, safe_serialization: None)
    return Trainer(Settings(), config, SimpleNamespace(engine=SimpleNamespace(module=module)), None)


def test_a_failed_push_is_counted_apart_from_the_samples_and_a_bug_keeps_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    t = trainer(tmp_path)
    refused, errors = push_failures("refused"), push_failures("error")

    def unreachable(*_args: object) -> None:
        raise WeightPushError("weight push of v1 failed after 4 attempts: connection refused")

    monkeypatch.setattr(trainer_module, "push_to_servers", unreachable)
    assert t._push_weights(None, 1) is None  # type: ignore[arg-type]
    assert push_failures("refused") == refused + 1 and push_failures("error") == errors
    assert not t.intake.skipped  # no sample was skipped
    (outage,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "connection refused" in outage.getMessage() and outage.exc_info is None

    caplog.clear()

    def bug(*_args: object) -> None:
        raise TypeError("push_to_servers() got an unexpected keyword argument")

    monkeypatch.setattr(trainer_module, "push_to_servers", bug)
    assert t._push_weights(None, 2) is None  # type: ignore[arg-type]
    assert push_failures("error") == errors + 1 and push_failures("refused") == refused + 1
    assert not t.intake.skipped and t.state.policy_version == 0
    (failure,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failure.exc_info is not None and failure.exc_info[0] is TypeError


class _Policy(torch.nn.Module):
    """Two layers, the top one training (as with train_top_layers: 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom, self.top = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
        self.bottom.requires_grad_(False)

    def save_pretrained(self, path: str, safe_serialization: bool) -> None:
        from safetensors.torch import save_file

        save_file(dict(self.state_dict()), f"{path}/model.safetensors")


def pushing_trainer(tmp_path: Path, url: str, **options: object) -> Trainer:
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        weights_dir=str(tmp_path / "w"),
        metrics_jsonl=None,
        policy_urls=[url],
        weight_push_attempts=2,
        weight_push_backoff_max_s=0.0,
        **options,  # type: ignore[arg-type]
    )
    engine = SimpleNamespace(engine=SimpleNamespace(module=_Policy()))
    t = Trainer(Settings(), config, engine, None)
    t.outbox = SimpleNamespace(send=lambda *_a, **_k: None)  # type: ignore[assignment]
    return t


TAKES_DELTAS = (200, b'{"success": true, "weight_deltas": true}')


def test_after_a_whole_push_the_trainer_pushes_deltas_and_whole_again_when_refused(
    tmp_path: Path, policy_server: tuple[str, list[tuple[int, bytes]], list[dict]]
) -> None:
    from safetensors.torch import load_file

    url, script, received = policy_server
    t = pushing_trainer(tmp_path, url)
    script += [TAKES_DELTAS, TAKES_DELTAS, (409, b"other base"), TAKES_DELTAS, TAKES_DELTAS]
    first = t._push_weights(None, 1)  # type: ignore[arg-type]
    assert first is not None and t._last_push["kind"] == "full"
    base = json.loads((Path(first.path) / "turnstream-base.json").read_text())["base"]
    second = t._push_weights(None, 2, {"kl": 0.25})  # type: ignore[arg-type]
    assert second is not None and t._last_push == {"kind": "delta", "bytes": (3 * 2 + 2) * 4}
    announced = json.loads(second.encode())  # what policy.versions carries
    assert announced["step_metrics"] == {"kl": 0.25} and announced["push"] == t._last_push
    manifest = json.loads((Path(second.path) / "turnstream-delta.json").read_text())
    assert manifest["base"] == base and manifest["version"] == 2
    assert set(load_file(str(Path(second.path) / "delta.safetensors"))) == {
        "top.weight",
        "top.bias",
    }
    third = t._push_weights(None, 3)  # refused for its base (409): pushed whole at once
    assert third is not None and t._last_push["kind"] == "full"
    assert [Path(r["model_path"]).name for r in received] == [
        "v000001", "v000002", "v000003", "v000003"
    ]  # fmt: skip
    assert not (Path(third.path) / "turnstream-delta.json").exists()
    assert t._push_weights(None, 4) is not None and t._last_push["kind"] == "delta"
    assert len(received) == 5  # the 409 was not tried again


def test_a_failed_delta_makes_the_next_push_whole_and_full_mode_never_sends_deltas(
    tmp_path: Path, policy_server: tuple[str, list[tuple[int, bytes]], list[dict]]
) -> None:
    url, script, received = policy_server
    t = pushing_trainer(tmp_path, url)
    script += [TAKES_DELTAS, (503, b"down"), (503, b"down"), TAKES_DELTAS]
    assert t._push_weights(None, 1) is not None  # type: ignore[arg-type]
    assert t._push_weights(None, 2) is None  # type: ignore[arg-type]  # a delta, twice refused
    assert t._push_weights(None, 3) is not None and t._last_push["kind"] == "full"  # type: ignore[arg-type]
    full = pushing_trainer(tmp_path / "full", url, weight_push="full")
    for step in (1, 2):
        assert full._push_weights(None, step) is not None  # type: ignore[arg-type]
        assert full._last_push["kind"] == "full"
    assert len(received) == 6
