"""The rollout processor protocol, the SDK guide's base class, and a runner for either kind.

A rollout processor is any object with ``setup()`` and ``process(RolloutInput)``
(``def`` or ``async def``) that returns a ``RolloutOutput``; subclassing
``AbstractRolloutProcessor`` is optional. An ``async def`` process runs on the
event loop; a plain ``def`` one in a thread of its own, since a rollout waits
on the policy and its tools (a sync ``trace_client``, a subprocess) and must
not hold up the loop or a timeout around it. A processor reports trouble it
expects (an LLM timeout, a tool that broke) as ``TaskStatus.FAILED``; an
exception from it is a bug and propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from pipeline.errors import RolloutError
from pipeline.rewards.protocols import processor_name
from pipeline.rollouts.types import RolloutInput, RolloutOutput


@runtime_checkable
class RolloutProcessor(Protocol):
    """Produces one trajectory for one task."""

    def setup(self) -> None:
        """Acquire resources once, before the first ``process`` (clients, tools)."""

    def process(self, input: RolloutInput) -> RolloutOutput | Awaitable[RolloutOutput]:
        """Run the agent on one task; FAILED (with ``error``) for expected trouble."""


class AbstractRolloutProcessor(ABC):
    """The rollout SDK guide's base class: subclass it, or write any class with these methods."""

    def setup(self) -> None:  # noqa: B027 (optional: many processors have nothing to set up)
        """Acquire resources once, before the first ``process``; by default nothing."""

    @abstractmethod
    def process(self, input: RolloutInput) -> RolloutOutput | Awaitable[RolloutOutput]:
        """One trajectory for ``input`` (``def`` or ``async def``)."""


def in_thread(fn: Callable[[Any], Any], arg: Any) -> asyncio.Future[Any]:
    """``fn(arg)`` in a daemon thread of its own, awaited as a future on the running loop.

    Not the loop's executor: a wait that times out leaves the thread to finish on its
    own, and neither the loop's shutdown nor the interpreter's exit waits for it.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    # Only the loop touches the future: the thread hands its outcome over with
    # call_soon_threadsafe, and settle() runs on the loop.
    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the wait was cancelled (timed out): nobody reads the outcome
            if inspect.iscoroutine(result):
                result.close()
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        result, error = None, None
        try:
            result = context.run(fn, arg)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name="rollout-process", daemon=True).start()
    return future


async def run_rollout_processor(processor: RolloutProcessor, input: RolloutInput) -> RolloutOutput:
    """Run ``process`` (an ``async def`` on the loop, a ``def`` in a thread of its own) and
    check that it returned a RolloutOutput."""
    process = processor.process
    result = (
        process(input) if inspect.iscoroutinefunction(process) else await in_thread(process, input)
    )
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, RolloutOutput):
        raise RolloutError(
            f"{processor_name(processor)}.process returned {type(result).__name__}, "
            "expected a RolloutOutput"
        )
    return result
