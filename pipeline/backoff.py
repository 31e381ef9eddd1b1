"""The one retry policy: bounded (or stop-bounded) attempts with exponential backoff.

Every place that calls something again after a transient failure (the judge
client, the weight push, the proxy's Kafka link, sink and version follower, the
trainer's outbox and offset commit) runs it through :func:`retry` or
:func:`retry_async` with a :class:`RetryPolicy` built from its settings. The
caller says which errors are transient; anything else propagates at once, and
the last transient error is raised again once the attempts are spent or
``stop()`` says to give up. (The ``turnstream retry`` command is another thing:
it re-queues judged pairs; see :mod:`pipeline.scoring.retry`.)
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pipeline.errors import ConfigError

T = TypeVar("T")
OnRetry = Callable[[int, BaseException, float], None]  # (failed attempt, its error, wait in s)


@dataclass(frozen=True)
class RetryPolicy:
    """How often to try and how long to wait between tries.

    The wait after failed attempt n is ``min(max_delay_s, initial_delay_s *
    multiplier ** (n - 1))``; with ``jitter`` it is a uniform random wait up to
    that (full jitter, so many callers that failed together do not retry
    together). ``max_attempts`` None: no cap, only ``stop()`` ends the tries.
    """

    max_attempts: int | None
    initial_delay_s: float
    max_delay_s: float
    multiplier: float = 2.0
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError(f"a retry policy needs max_attempts >= 1, got {self.max_attempts}")
        if self.initial_delay_s < 0 or self.max_delay_s < 0:
            raise ConfigError(
                f"a retry policy needs delays >= 0, got initial_delay_s={self.initial_delay_s} "
                f"and max_delay_s={self.max_delay_s}"
            )
        if self.multiplier < 1:
            raise ConfigError(f"a retry policy needs multiplier >= 1, got {self.multiplier}")

    def exhausted(self, attempts: int) -> bool:
        """Whether ``attempts`` tries are all this policy allows."""
        return self.max_attempts is not None and attempts >= self.max_attempts

    def delay(
        self, attempt: int, uniform: Callable[[float, float], float] = random.uniform
    ) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1 = the first try)."""
        try:
            grown = self.initial_delay_s * self.multiplier ** (attempt - 1)
        except OverflowError:  # thousands of tries into an outage: the cap long since
            grown = math.inf
        cap = min(self.max_delay_s, grown)
        return uniform(0.0, cap) if self.jitter else cap


def _never() -> bool:
    return False


def _any(_error: BaseException) -> bool:
    return True


def retry(
    attempt: Callable[[int], T],
    policy: RetryPolicy,
    transient: tuple[type[BaseException], ...],
    *,
    when: Callable[[BaseException], bool] = _any,
    on_retry: OnRetry | None = None,
    stop: Callable[[], bool] = _never,
    wait: Callable[[float], object] = time.sleep,
) -> T:
    """``attempt(n)`` for n = 1, 2, ... until it returns, waiting between tries.

    An error of a ``transient`` type for which ``when`` is true is tried again
    (``on_retry`` is told first); it is raised once the policy's attempts are
    spent, or when ``stop()`` is true after a failure or after a wait. Any other
    error propagates at once. ``wait`` (``time.sleep``, or an Event's ``wait``
    to wake for a stop) sleeps between tries.
    """
    n = 1
    while True:
        try:
            return attempt(n)
        except transient as exc:
            if not when(exc) or policy.exhausted(n) or stop():
                raise
            delay = policy.delay(n)
            if on_retry is not None:
                on_retry(n, exc, delay)
            wait(delay)
            if stop():
                raise
        n += 1


async def retry_async(
    attempt: Callable[[int], Awaitable[T]],
    policy: RetryPolicy,
    transient: tuple[type[BaseException], ...],
    *,
    when: Callable[[BaseException], bool] = _any,
    on_retry: OnRetry | None = None,
    stop: Callable[[], bool] = _never,
) -> T:
    """:func:`retry` for a coroutine: ``await attempt(n)``, with ``asyncio.sleep`` between."""
    n = 1
    while True:
        try:
            return await attempt(n)
        except transient as exc:
            if not when(exc) or policy.exhausted(n) or stop():
                raise
            delay = policy.delay(n)
            if on_retry is not None:
                on_retry(n, exc, delay)
            await asyncio.sleep(delay)
            if stop():
                raise
        n += 1
