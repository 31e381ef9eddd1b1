"""What one rollout did: its model calls and tool calls, recorded as they finish.

``trace_client`` records each chat completion as a ``ModelCall`` and
``trace_tool`` each tool call as a ``ToolCall`` on the input's ``trace``; the
rollout stage turns them into turns. Each record has the ``index`` its call
started with, so the trace lists calls in the order they were made even when
tools ran concurrently.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from pipeline.rollouts.types import RolloutInput

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ModelCall:
    """One chat completion: what was asked and the assistant message that came back."""

    index: int
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    params: dict[str, Any]
    response: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, Any] | None
    duration_s: float


@dataclass(frozen=True)
class ToolCall:
    """One tool call: its arguments by name and its result, or the text of what it raised."""

    index: int
    name: str
    arguments: dict[str, Any]
    result: Any
    error: str | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


class RolloutTrace:
    """The calls of one rollout, in the order they started."""

    def __init__(self) -> None:
        # Wrapped clients and tools may run on the event loop and in worker threads at
        # once (a sync tool under asyncio.to_thread); the lock covers both fields.
        self._lock = threading.Lock()
        self._started = 0
        self._calls: list[ModelCall | ToolCall] = []

    def __copy__(self) -> RolloutTrace:
        """A copied input is another rollout of the task: its trace starts empty."""
        return RolloutTrace()

    def __deepcopy__(self, memo: dict[int, Any]) -> RolloutTrace:
        return RolloutTrace()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to another process) with its calls; the lock is made anew."""
        with self._lock:
            return {"started": self._started, "calls": list(self._calls)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        self._started, self._calls = state["started"], state["calls"]

    def start(self) -> int:
        """The index of a call that starts now."""
        with self._lock:
            index = self._started
            self._started += 1
            return index

    def add(self, call: ModelCall | ToolCall) -> None:
        with self._lock:
            self._calls.append(call)

    @property
    def calls(self) -> list[ModelCall | ToolCall]:
        """Every finished call, by the order it started."""
        with self._lock:
            return sorted(self._calls, key=lambda c: c.index)

    @property
    def model_calls(self) -> list[ModelCall]:
        return [c for c in self.calls if isinstance(c, ModelCall)]

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """The call's arguments by parameter name; ``*args`` under that key when they do not bind."""
    try:
        return dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):  # no signature, or a call that will raise TypeError
        return {**({"*args": list(args)} if args else {}), **kwargs}


def _is_async(fn: Callable[..., Any]) -> bool:
    # an object with an async __call__ is an async tool too
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def trace_tool(input: RolloutInput, fn: F, name: str | None = None) -> F:
    """``fn`` (sync or async), recording each call on ``input.trace``; what it raises goes on."""
    trace = input.trace
    tool = name or str(getattr(fn, "__name__", type(fn).__name__))

    def begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
        return trace.start(), _arguments(fn, args, kwargs), time.perf_counter()

    def record(
        call: tuple[int, dict[str, Any], float], result: Any, error: str | None = None
    ) -> None:
        index, arguments, started = call
        duration = time.perf_counter() - started
        trace.add(ToolCall(index, tool, arguments, result, error, duration))

    if _is_async(fn):

        @functools.wraps(fn)
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            call = begin(args, kwargs)
            try:
                result = await fn(*args, **kwargs)
            except Exception as exc:
                record(call, None, error_text(exc))
                raise
            record(call, result)
            return result

        return cast(F, traced_async)

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        call = begin(args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            record(call, None, error_text(exc))
            raise
        record(call, result)
        return result

    return cast(F, traced)
