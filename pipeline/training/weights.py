"""Weight push: save HF weights, tell each policy server to load them, publish the version.

A push is the whole checkpoint, or a delta: only the parameters that train
(``requires_grad``; with ``train_top_layers`` the rest never changes), which a
`turnstream serve` applies to the weights it has (``pipeline.serving.weights``).
A delta names the whole push it follows (its ``base``), so a server that missed
that push, or restarted, refuses it and gets the whole checkpoint instead.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from pipeline.backoff import RetryPolicy, retry
from pipeline.errors import TurnstreamError
from pipeline.models.weight_files import BASE_FILE, DELTA_FILE, DELTA_TENSORS

log = logging.getLogger(__name__)


class WeightPushError(TurnstreamError):
    """A policy server did not accept new weights after every retry."""


class WrongBase(WeightPushError):
    """A server refused a delta: it serves other weights than the delta's base."""


class _Transient(WeightPushError):
    """One try failed in a way another try may not (down, busy, refused)."""


@dataclass(frozen=True)
class PolicyVersion:
    """A version pushed (on policy.versions): what it is, and the sentinels of the step
    that made it: its batch's reward mean and response length (answers of the version
    before), entropy and KL to the initial policy on the weights before the update."""

    version: int
    path: str
    step: int
    ts: float
    step_metrics: dict[str, float] | None = None
    push: dict[str, Any] | None = None  # kind (full or delta) and bytes written

    def encode(self) -> bytes:
        return orjson.dumps(vars(self))


def version_dir(weights_dir: Path, version: int) -> Path:
    """Where version ``version`` is written: ``vNNNNNN`` (the name servers read it from)."""
    return weights_dir / f"v{version:06d}"


def save_weights(
    model: Any, tokenizer: Any, weights_dir: Path, version: int, base: str | None = None
) -> Path:
    """Write the policy as a HF checkpoint directory (what SGLang loads from disk); with
    ``base``, the id later deltas on these weights name (``turnstream-base.json``)."""
    path = version_dir(weights_dir, version)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    if base is not None:
        (path / BASE_FILE).write_bytes(orjson.dumps({"base": base}))
    return path


def trained_tensors(model: Any) -> dict[str, Any]:
    """The parameters that train, by their ``state_dict`` names (what a delta carries)."""
    return {
        name: param.detach().contiguous()
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def save_delta(model: Any, weights_dir: Path, version: int, base: str) -> tuple[Path, int]:
    """Write the trained tensors as a delta on ``base``; (its directory, its bytes)."""
    from safetensors.torch import save_file

    tensors = trained_tensors(model)
    path = version_dir(weights_dir, version)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / DELTA_TENSORS))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    manifest = {"base": base, "version": version, "tensors": len(tensors), "bytes": size}
    (path / DELTA_FILE).write_bytes(orjson.dumps(manifest))
    return path, size


def push_to_servers(
    urls: list[str],
    path: Path,
    retry_policy: RetryPolicy,
    timeout_s: float = 600.0,
    weight_version: str | None = None,
) -> list[dict[str, Any]]:
    """POST /update_weights_from_disk to every policy server, each tried again with backoff
    (``weight_version``: SGLang's field naming the version the servers report); their
    answers, in order. A delta that a server refuses for its base (409) is not tried again:
    it needs the whole checkpoint."""
    request_body: dict[str, str] = {"model_path": str(path)}
    if weight_version is not None:
        request_body["weight_version"] = weight_version
    body = orjson.dumps(request_body)
    answers = []
    for url in urls:
        try:
            answers.append(
                retry(
                    partial(_push, url, body, timeout_s),
                    retry_policy,
                    (_Transient,),
                    on_retry=_log_retry,
                )
            )
        except _Transient as exc:
            raise WeightPushError(
                f"weight push of {path} failed after {retry_policy.max_attempts} attempts: {exc}"
            ) from exc
    return answers


def _log_retry(attempt: int, error: BaseException, _delay_s: float) -> None:
    log.warning("weight push attempt %d failed: %s", attempt, error)


def _push(url: str, body: bytes, timeout_s: float, _attempt: int) -> dict[str, Any]:
    """One request to one server, its answer; WeightPushError saying why it did not take
    the weights."""
    request = urllib.request.Request(
        url.rstrip("/") + "/update_weights_from_disk",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            data = orjson.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read()[:300]
        if exc.code == 409:
            raise WrongBase(f"{url} answered 409: {text!r}") from exc
        raise _Transient(f"{url} answered {exc.code}: {text!r}") from exc
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        raise _Transient(f"{url}: {exc}") from exc
    if not isinstance(data, dict) or not data.get("success", True):
        refused = data.get("message", data) if isinstance(data, dict) else data
        raise _Transient(f"{url} refused the weights: {refused}")
    return data
