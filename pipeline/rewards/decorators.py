"""Multi-dimension rewards: ``reward_func``, ``sub_reward_func`` and ``aggregate_func``.

A class decorated with ``@reward_func("Name")`` whose methods are marked
``@sub_reward_func(name, sub_weight=w)`` gets a ``process`` that runs every
sub-reward on the input (sync ones inline, async ones concurrently), collects
them as ``{name: RewardOutput}`` in definition order, and hands that dict to
the method marked ``@aggregate_func``. Without an aggregate the score is
``sum(sub_weight * sub_score)`` (weights are not normalised) and the metrics
are those of ``get_reward_metrics``. If a sub-reward FAILED, the processor
returns FAILED naming it, and the aggregate is not called.

The class also gets ``get_weights()``, ``get_scores(sub_rewards)`` and
``get_reward_metrics(sub_rewards)`` for its aggregate to use, and a no-op
``setup()`` if it has none.
"""

from __future__ import annotations

import abc
import asyncio
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from pipeline.errors import RewardError
from pipeline.rewards.types import RewardInput, RewardOutput

T = TypeVar("T", bound=type)
F = TypeVar("F", bound=Callable[..., Any])

_SUB = "__sub_reward__"
_AGGREGATE = "__aggregate_func__"


@dataclass(frozen=True)
class SubReward:
    name: str
    sub_weight: float
    attr: str = ""


def sub_reward_func(name: str, sub_weight: float = 1.0) -> Callable[[F], F]:
    """Mark a method ``(self, input: RewardInput) -> RewardOutput`` as one scored dimension."""
    if not name:
        raise ValueError("sub_reward_func needs a name")
    if not math.isfinite(sub_weight):
        raise ValueError(f"sub_reward_func({name!r}): sub_weight must be finite, got {sub_weight}")

    def mark(fn: F) -> F:
        setattr(fn, _SUB, SubReward(name, float(sub_weight)))
        return fn

    return mark


def aggregate_func(fn: F) -> F:
    """Mark the method ``(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput``."""
    setattr(fn, _AGGREGATE, True)
    return fn


@overload
def reward_func(name: T) -> T: ...


@overload
def reward_func(name: str | None = None) -> Callable[[T], T]: ...


def reward_func(name: str | type | None = None) -> Any:
    """Name a reward processor class; with sub-rewards, give it the aggregating ``process``."""
    if isinstance(name, type):
        return _build(name, name.__name__)

    def decorate(cls: T) -> T:
        return _build(cls, name or cls.__name__)

    return decorate


def _collect(cls: type) -> tuple[list[SubReward], str | None]:
    """The marked methods of ``cls`` and its bases, in definition order (subclasses override)."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            found.pop(attr, None)
            found[attr] = value
    subs: list[SubReward] = []
    aggregates: list[str] = []
    for attr, value in found.items():
        mark = getattr(value, _SUB, None)
        if isinstance(mark, SubReward):
            subs.append(SubReward(mark.name, mark.sub_weight, attr))
        if getattr(value, _AGGREGATE, False):
            aggregates.append(attr)
    names = [s.name for s in subs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TypeError(f"{cls.__name__}: sub-reward name(s) used twice: {', '.join(duplicates)}")
    if len(aggregates) > 1:
        raise TypeError(f"{cls.__name__}: more than one @aggregate_func ({', '.join(aggregates)})")
    return subs, aggregates[0] if aggregates else None


def _build(cls: T, name: str) -> T:
    subs, aggregate = _collect(cls)
    cls.__reward_name__ = name  # type: ignore[attr-defined]
    if not subs:
        if aggregate:
            raise TypeError(f"{cls.__name__}: @aggregate_func without any @sub_reward_func")
        return cls
    if any(_own_process(k) for k in cls.__mro__):
        raise TypeError(
            f"{cls.__name__}: a class with @sub_reward_func methods gets its process() from "
            "@reward_func; remove its own process() or its sub-rewards"
        )
    cls.__sub_rewards__ = tuple(subs)  # type: ignore[attr-defined]
    cls.__aggregate_attr__ = aggregate  # type: ignore[attr-defined]
    cls.process = _process  # type: ignore[attr-defined]
    cls.get_weights = _get_weights  # type: ignore[attr-defined]
    cls.get_scores = staticmethod(get_scores)  # type: ignore[attr-defined]
    cls.get_reward_metrics = staticmethod(get_reward_metrics)  # type: ignore[attr-defined]
    if not callable(getattr(cls, "setup", None)):
        cls.setup = lambda self: None  # type: ignore[attr-defined]
    abc.update_abstractmethods(cls)  # a base's abstract process() is implemented now
    return cls


def _own_process(klass: type) -> bool:
    """Whether ``klass`` defines a ``process`` of its own (an abstract one is only declared)."""
    process = vars(klass).get("process", _process)
    return process is not _process and not getattr(process, "__isabstractmethod__", False)


def get_scores(sub_rewards: dict[str, RewardOutput]) -> dict[str, float]:
    """``{sub-reward name: its score}`` for the sub-rewards that succeeded."""
    return {name: out.score for name, out in sub_rewards.items() if out.ok}


def get_reward_metrics(sub_rewards: dict[str, RewardOutput]) -> dict[str, float]:
    """Each sub-reward's score as ``name`` and its own metrics as ``name/metric``."""
    metrics: dict[str, float] = {}
    for name, out in sub_rewards.items():
        if out.reward is None:
            continue
        metrics[name] = out.reward.reward_score
        for key, value in out.reward.reward_metrics.items():
            metrics[f"{name}/{key}"] = value
    return metrics


def _get_weights(self: Any) -> dict[str, float]:
    """``{sub-reward name: sub_weight}``, in definition order."""
    return {s.name: s.sub_weight for s in type(self).__sub_rewards__}


async def _run_sub(self: Any, sub: SubReward, input: RewardInput) -> RewardOutput:
    result = getattr(self, sub.attr)(input)
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, RewardOutput):
        raise RewardError(
            f"{type(self).__name__}.{sub.attr} (sub-reward {sub.name!r}) returned "
            f"{type(result).__name__}, expected a RewardOutput"
        )
    return result


async def _process(self: Any, input: RewardInput) -> RewardOutput:
    subs: tuple[SubReward, ...] = type(self).__sub_rewards__
    outputs = await asyncio.gather(*(_run_sub(self, sub, input) for sub in subs))
    sub_rewards = {sub.name: out for sub, out in zip(subs, outputs, strict=True)}
    failed = [f"{name}: {out.error}" for name, out in sub_rewards.items() if not out.ok]
    if failed:
        return RewardOutput.failed("sub-reward failed: " + "; ".join(failed))
    aggregate = type(self).__aggregate_attr__
    if aggregate is None:
        weights = self.get_weights()
        scores = get_scores(sub_rewards)
        total = sum(scores[name] * weights[name] for name in scores)
        return RewardOutput.success(total, get_reward_metrics(sub_rewards))
    result = getattr(self, aggregate)(sub_rewards)
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, RewardOutput):
        raise RewardError(
            f"{type(self).__name__}.{aggregate} (@aggregate_func) returned "
            f"{type(result).__name__}, expected a RewardOutput"
        )
    return result
