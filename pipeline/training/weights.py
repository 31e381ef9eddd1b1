"""Weight push: save HF weights, tell each policy server to load them, publish the version."""

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

log = logging.getLogger(__name__)


class WeightPushError(TurnstreamError):
    """A policy server did not accept new weights after every retry."""


@dataclass(frozen=True)
class PolicyVersion:
    version: int
    path: str
    step: int
    ts: float

    def encode(self) -> bytes:
        return orjson.dumps(vars(self))


def save_weights(model: Any, tokenizer: Any, weights_dir: Path, version: int) -> Path:
    """Write the policy as a HF checkpoint directory (what SGLang loads from disk)."""
    path = weights_dir / f"v{version:06d}"
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
    return path


def push_to_servers(
    urls: list[str],
    path: Path,
    retry_policy: RetryPolicy,
    timeout_s: float = 600.0,
    weight_version: str | None = None,
) -> None:
    """POST /update_weights_from_disk to every policy server, each tried again with backoff
    (``weight_version``: SGLang's field naming the version the servers report)."""
    request_body: dict[str, str] = {"model_path": str(path)}
    if weight_version is not None:
        request_body["weight_version"] = weight_version
    body = orjson.dumps(request_body)
    for url in urls:
        try:
            retry(
                partial(_push, url, body, timeout_s),
                retry_policy,
                (WeightPushError,),
                on_retry=_log_retry,
            )
        except WeightPushError as exc:
            raise WeightPushError(
                f"weight push of {path} failed after {retry_policy.max_attempts} attempts: {exc}"
            ) from exc


def _log_retry(attempt: int, error: BaseException, _delay_s: float) -> None:
    log.warning("weight push attempt %d failed: %s", attempt, error)


def _push(url: str, body: bytes, timeout_s: float, _attempt: int) -> None:
    """One request to one server; WeightPushError saying why it did not take the weights."""
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
        raise WeightPushError(f"{url} answered {exc.code}: {exc.read()[:200]!r}") from exc
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError) as exc:
        raise WeightPushError(f"{url}: {exc}") from exc
    if not data.get("success", True):
        raise WeightPushError(f"{url} refused the weights: {data.get('message', data)}")
