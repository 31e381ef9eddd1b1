"""``observe_processor``: every call of a processor's method timed, counted and logged once.

Decorate ``process`` (or a sub-reward) of any function component, rollout,
reward or group reward, ``def`` or ``async def``. Each call adds to
``turnstream_processor_seconds{processor, status}`` and
``turnstream_processor_calls_total{processor, status, error}`` and writes one
log line: INFO for a SUCCESS, WARNING with the error for a FAILED output,
ERROR with the exception for a raise (which goes on to the caller). The
status is read from the output's ``status``; an output without one counts as
``invalid``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from pipeline.rewards.metrics import PROCESSOR_CALLS, PROCESSOR_SECONDS
from pipeline.rewards.protocols import processor_name
from pipeline.rewards.types import TaskStatus

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_IDS = ("sample_id", "rollout_id")


def observe_processor(fn: F) -> F:
    """Time, count and log each call of ``fn`` by its outcome (see the module's docstring)."""
    params = list(inspect.signature(fn).parameters)
    is_method = bool(params) and params[0] == "self"

    def name_of(args: tuple[Any, ...]) -> str:
        if is_method and args:
            return f"{processor_name(args[0])}.{fn.__name__}"
        return fn.__qualname__

    def input_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rest = args[1:] if is_method else args
        return rest[0] if rest else kwargs.get("input")

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def observed_async(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                result = await fn(*args, **kwargs)
            except Exception as exc:
                _report(name_of(args), input_of(args, kwargs), started, None, exc)
                raise
            _report(name_of(args), input_of(args, kwargs), started, result, None)
            return result

        return cast(F, observed_async)

    @functools.wraps(fn)
    def observed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            _report(name_of(args), input_of(args, kwargs), started, None, exc)
            raise
        _report(name_of(args), input_of(args, kwargs), started, result, None)
        return result

    return cast(F, observed)


def outcome(result: Any, exc: BaseException | None) -> tuple[str, str, str]:
    """``(status, error label, detail for the log)`` of one call."""
    if exc is not None:
        return "exception", type(exc).__name__, f": {type(exc).__name__}: {exc}"
    status = getattr(result, "status", None)
    if status == TaskStatus.SUCCESS:
        return "success", "", ""
    if status == TaskStatus.FAILED:
        return "failed", "failed", f": {getattr(result, 'error', None)}"
    kind = type(result).__name__
    return "invalid", kind, f": returned {kind}, which has no status"


def _ids(input: Any) -> str:
    metadata = getattr(input, "request_metadata", None)
    if not isinstance(metadata, dict):
        return ""
    found = [f"{key}={metadata[key]}" for key in _IDS if metadata.get(key) is not None]
    return f" [{', '.join(found)}]" if found else ""


def _report(name: str, input: Any, started: float, result: Any, exc: BaseException | None) -> None:
    seconds = time.perf_counter() - started
    status, error, detail = outcome(result, exc)
    PROCESSOR_SECONDS.labels(name, status).observe(seconds)
    PROCESSOR_CALLS.labels(name, status, error).inc()
    level = {"success": logging.INFO, "exception": logging.ERROR}.get(status, logging.WARNING)
    log.log(level, "%s: %s in %.3f s%s%s", name, status, seconds, _ids(input), detail)
