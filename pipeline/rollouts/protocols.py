"""The rollout processor protocol, the SDK guide's base class, and a runner for either kind.

A rollout processor is any object with ``setup()`` and ``process(RolloutInput)``
(``def`` or ``async def``) that returns a ``RolloutOutput``; subclassing
``AbstractRolloutProcessor`` is optional. A processor reports trouble it
expects (an LLM timeout, a tool that broke) as ``TaskStatus.FAILED``; an
exception from it is a bug and propagates.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

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


async def run_rollout_processor(processor: RolloutProcessor, input: RolloutInput) -> RolloutOutput:
    """Run ``process`` (sync or async) and check that it returned a RolloutOutput."""
    result = processor.process(input)
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, RolloutOutput):
        raise RolloutError(
            f"{processor_name(processor)}.process returned {type(result).__name__}, "
            "expected a RolloutOutput"
        )
    return result
