"""The processor protocols, and helpers that run a processor whether it is sync or async.

A processor is any object with ``setup()`` and ``process(input)``; no base class
is needed. ``AbstractRewardProcessor`` and ``AbstractGroupRewardProcessor`` are
the reward SDK guide's names, for code written against it: they implement
nothing but a no-op ``setup()`` and declare ``process`` abstract.
``process`` may be ``def`` or ``async def``. A sync ``process`` runs on the
event loop, so it should be quick (rules, regexes); anything that waits on the
network should be ``async def``. A processor reports transient trouble as
``TaskStatus.FAILED``; an exception from it is a bug and propagates.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import Any, Protocol, runtime_checkable

from pipeline.errors import RewardError
from pipeline.rewards.types import (
    GroupRewardInput,
    GroupRewardOutput,
    RewardInput,
    RewardOutput,
    TaskStatus,
)


@runtime_checkable
class RewardProcessor(Protocol):
    """Scores one output."""

    def setup(self) -> None:
        """Acquire resources once, before the first ``process`` (clients, models)."""

    def process(self, input: RewardInput) -> RewardOutput | Awaitable[RewardOutput]:
        """Score one input; FAILED (with ``error``) only for transient trouble."""


@runtime_checkable
class GroupRewardProcessor(Protocol):
    """Scores several outputs of the same prompt together: one reward per output, in order."""

    def setup(self) -> None:
        """Acquire resources once, before the first ``process``."""

    def process(self, input: GroupRewardInput) -> GroupRewardOutput | Awaitable[GroupRewardOutput]:
        """Score every output of ``input.agent_outputs``; no max-normalisation inside a group."""


class AbstractRewardProcessor(ABC):
    """The reward SDK guide's base class: subclass it, or write any class with these methods."""

    def setup(self) -> None:  # noqa: B027 (optional: many processors have nothing to set up)
        """Acquire resources once, before the first ``process``; by default nothing."""

    @abstractmethod
    def process(self, input: RewardInput) -> RewardOutput | Awaitable[RewardOutput]:
        """Score one input (``def`` or ``async def``); FAILED only for transient trouble."""


class AbstractGroupRewardProcessor(ABC):
    """The reward SDK guide's base class of a group reward."""

    def setup(self) -> None:  # noqa: B027 (optional: many processors have nothing to set up)
        """Acquire resources once, before the first ``process``; by default nothing."""

    @abstractmethod
    def process(self, input: GroupRewardInput) -> GroupRewardOutput | Awaitable[GroupRewardOutput]:
        """One reward per output of ``input.agent_outputs``, in order (``def`` or ``async def``)."""


def processor_name(processor: object) -> str:
    """The name given with ``@reward_func("...")``, else the class name."""
    name = getattr(processor, "__reward_name__", None)
    return str(name) if name else type(processor).__name__


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def setup_processor(processor: object) -> None:
    """Call ``setup()`` if the processor has one; it must be a plain ``def``, as in the SDK."""
    setup = getattr(processor, "setup", None)
    if not callable(setup):
        return
    result = setup()
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise RewardError(
            f"{processor_name(processor)}.setup() must be a plain def (it runs once, before "
            "the first process); do async set-up on the first process() call instead"
        )


async def close_processor(processor: object) -> None:
    """Release what ``setup()`` acquired, if the processor has ``close()`` (sync or async)."""
    close = getattr(processor, "close", None)
    if callable(close):
        await _maybe_await(close())


async def run_processor(processor: RewardProcessor, input: RewardInput) -> RewardOutput:
    """Run ``process`` (sync or async) and check that it returned a RewardOutput."""
    result = await _maybe_await(processor.process(input))
    if not isinstance(result, RewardOutput):
        raise RewardError(
            f"{processor_name(processor)}.process returned {type(result).__name__}, "
            "expected a RewardOutput"
        )
    return result


async def run_group_processor(
    processor: GroupRewardProcessor, input: GroupRewardInput
) -> GroupRewardOutput:
    """Run a group processor and check it gave exactly one reward per output."""
    result = await _maybe_await(processor.process(input))
    if not isinstance(result, GroupRewardOutput):
        raise RewardError(
            f"{processor_name(processor)}.process returned {type(result).__name__}, "
            "expected a GroupRewardOutput"
        )
    if result.status is TaskStatus.SUCCESS and result.reward is not None:
        got, want = len(result.reward.rewards), len(input.agent_outputs)
        if got != want:
            raise RewardError(
                f"{processor_name(processor)} returned {got} reward(s) for {want} output(s); "
                "a group processor must return exactly one per output (0 for a failed one)"
            )
    return result
