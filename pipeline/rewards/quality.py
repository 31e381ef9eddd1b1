"""Judge-quality tools: length bias over a sliding window, and order-checked pairwise verdicts.

Length bias: an LLM judge tends to prefer longer answers, and a policy trained
on it learns to pad. :class:`LengthBias` keeps the last ``window`` (score,
response length) pairs and exports their correlation as
``turnstream_reward_length_bias``; a value drifting toward 1 is the signal.

Position bias: a pairwise judge tends to prefer whichever answer it reads
first. :func:`judge_pairwise` asks both orders and keeps only a verdict that
survives the swap; anything else is ``"inconsistent"`` (no preference signal).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from pipeline.rewards import metrics
from pipeline.rewards.stats import pearson, spearman_rho

T = TypeVar("T")
CorrelationMethod = Literal["spearman", "pearson"]
Verdict = Literal["first", "second", "tie"]
PairwiseOutcome = Literal["a", "b", "tie", "inconsistent"]
VERDICTS: tuple[Verdict, ...] = ("first", "second", "tie")


def length_bias(
    scores: Sequence[float], lengths: Sequence[float], method: CorrelationMethod = "spearman"
) -> float | None:
    """Correlation of score with response length; None when undefined (constant, < 2 points)."""
    if method == "spearman":
        return spearman_rho(lengths, scores)
    if method == "pearson":
        return pearson(lengths, scores)
    raise ValueError(f"unknown correlation method {method!r}; use spearman or pearson")


class LengthBias:
    """The correlation of score with response length over the last ``window`` observations."""

    def __init__(
        self,
        processor: str = "reward",
        window: int = 512,
        method: CorrelationMethod = "spearman",
        min_points: int = 20,
    ) -> None:
        if window < 2 or min_points < 2 or min_points > window:
            raise ValueError(f"need 2 <= min_points <= window, got {min_points} and {window}")
        if method not in ("spearman", "pearson"):
            raise ValueError(f"unknown correlation method {method!r}; use spearman or pearson")
        self.processor, self.method, self.min_points = processor, method, min_points
        self._scores: deque[float] = deque(maxlen=window)
        self._lengths: deque[float] = deque(maxlen=window)
        # computed when /metrics is scraped, not per observation (a rank correlation over
        # the window costs too much to run for every scored sample)
        metrics.LENGTH_BIAS.labels(processor, method).set_function(self._gauge)

    def observe(self, score: float, response_length: float) -> None:
        """Add one scored output (cheap: the correlation is computed when asked for)."""
        self._scores.append(score)
        self._lengths.append(response_length)

    def value(self) -> float | None:
        """The window's correlation; None until ``min_points`` or when it is undefined."""
        if len(self._scores) < self.min_points:
            return None
        return length_bias(list(self._scores), list(self._lengths), self.method)

    def _gauge(self) -> float:
        value = self.value()
        return math.nan if value is None else value


def consistent_verdict(ab: Verdict, ba: Verdict) -> PairwiseOutcome:
    """The verdict on (a, b) from the judge shown ``a, b`` (``ab``) and ``b, a`` (``ba``).

    Kept only when it survives the swap: a first then second means a; second
    then first means b; tie both times is a tie; anything else is inconsistent.
    """
    for verdict in (ab, ba):
        if verdict not in VERDICTS:
            raise ValueError(f"a pairwise verdict is one of {VERDICTS}, got {verdict!r}")
    if ab == "first" and ba == "second":
        return "a"
    if ab == "second" and ba == "first":
        return "b"
    if ab == "tie" and ba == "tie":
        return "tie"
    return "inconsistent"


async def judge_pairwise(
    compare: Callable[[T, T], Verdict | Awaitable[Verdict]], a: T, b: T
) -> PairwiseOutcome:
    """Ask ``compare`` both orders (concurrently) and keep only a consistent verdict."""

    async def ask(first: T, second: T) -> Verdict:
        result = compare(first, second)
        return await result if inspect.isawaitable(result) else result

    ab, ba = await asyncio.gather(ask(a, b), ask(b, a))
    outcome = consistent_verdict(ab, ba)
    metrics.PAIRWISE.labels(outcome).inc()
    return outcome
