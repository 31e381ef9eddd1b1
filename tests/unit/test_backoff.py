"""The one retry policy: its waits, its cap, what it retries, and whom it tells."""

from __future__ import annotations

import pytest

from pipeline.backoff import RetryPolicy, retry, retry_async
from pipeline.errors import ConfigError


class Flaky:
    """Fails with ``errors`` in turn (one per call), then answers ``"done"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls: list[int] = []

    def __call__(self, attempt: int) -> str:
        self.calls.append(attempt)
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_waits_grow_by_the_multiplier_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=None, initial_delay_s=0.5, max_delay_s=5.0)
    assert [policy.delay(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    tripled = RetryPolicy(max_attempts=None, initial_delay_s=1.0, max_delay_s=30.0, multiplier=3)
    assert [tripled.delay(n) for n in range(1, 6)] == [1.0, 3.0, 9.0, 27.0, 30.0]
    assert policy.delay(100_000) == 5.0  # a long outage: the cap, not an overflow


def test_jitter_draws_a_wait_between_zero_and_the_bound() -> None:
    policy = RetryPolicy(max_attempts=4, initial_delay_s=0.5, max_delay_s=8.0, jitter=True)
    bounds: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        bounds.append((low, high))
        return high / 4

    assert [policy.delay(n, uniform) for n in (1, 2, 3, 6)] == [0.125, 0.25, 0.5, 2.0]
    assert bounds == [(0.0, 0.5), (0.0, 1.0), (0.0, 2.0), (0.0, 8.0)]
    assert all(0.0 <= policy.delay(3) <= 2.0 for _ in range(200))


def test_transient_errors_are_retried_with_the_policys_waits() -> None:
    waits: list[float] = []
    told: list[tuple[int, str, float]] = []
    flaky = Flaky(TimeoutError("slow"), ConnectionError("refused"))
    result = retry(
        flaky,
        RetryPolicy(max_attempts=3, initial_delay_s=0.5, max_delay_s=8.0),
        (TimeoutError, ConnectionError),
        on_retry=lambda n, exc, delay: told.append((n, str(exc), delay)),
        wait=waits.append,
    )
    assert result == "done" and flaky.calls == [1, 2, 3]
    assert waits == [0.5, 1.0]
    assert told == [(1, "slow", 0.5), (2, "refused", 1.0)]  # once per retry, before its wait


def test_the_last_error_is_raised_once_the_attempts_are_spent() -> None:
    waits: list[float] = []
    told: list[int] = []
    flaky = Flaky(*(TimeoutError(f"try {n}") for n in range(1, 6)))
    with pytest.raises(TimeoutError, match="try 3"):
        retry(
            flaky,
            RetryPolicy(max_attempts=3, initial_delay_s=1.0, max_delay_s=1.5),
            (TimeoutError,),
            on_retry=lambda n, _exc, _delay: told.append(n),
            wait=waits.append,
        )
    assert flaky.calls == [1, 2, 3] and waits == [1.0, 1.5] and told == [1, 2]


def test_other_errors_are_not_retried() -> None:
    waits: list[float] = []
    flaky = Flaky(KeyError("a bug"))
    with pytest.raises(KeyError):
        retry(flaky, RetryPolicy(5, 0.1, 1.0), (TimeoutError,), wait=waits.append)
    assert flaky.calls == [1] and waits == []
    # an error of a transient type that ``when`` refuses (kafka-python's non-retriable ones)
    refused = Flaky(TimeoutError("final"))
    with pytest.raises(TimeoutError, match="final"):
        retry(refused, RetryPolicy(5, 0.1, 1.0), (TimeoutError,), when=lambda _e: False)
    assert refused.calls == [1]


def test_without_a_cap_only_a_stop_ends_the_tries() -> None:
    waits: list[float] = []
    flaky = Flaky(*(OSError(f"down {n}") for n in range(1, 100)))
    with pytest.raises(OSError, match="down 4"):
        retry(
            flaky,
            RetryPolicy(max_attempts=None, initial_delay_s=1.0, max_delay_s=30.0),
            (OSError,),
            stop=lambda: len(waits) == 4,  # a stop that came during the fourth wait
            wait=waits.append,
        )
    assert flaky.calls == [1, 2, 3, 4] and waits == [1.0, 2.0, 4.0, 8.0]
    stopped = Flaky(OSError("down"))
    with pytest.raises(OSError):  # already stopping: no wait at all
        retry(
            stopped, RetryPolicy(None, 1.0, 30.0), (OSError,), stop=lambda: True, wait=waits.append
        )
    assert stopped.calls == [1] and len(waits) == 4


async def test_the_async_runner_retries_the_same_way() -> None:
    told: list[int] = []
    calls: list[int] = []

    async def attempt(n: int) -> int:
        calls.append(n)
        if n < 3:
            raise ConnectionError(f"refused {n}")
        return n * 10

    policy = RetryPolicy(max_attempts=3, initial_delay_s=0.0, max_delay_s=0.0, jitter=True)
    got = await retry_async(
        attempt, policy, (ConnectionError,), on_retry=lambda n, *_: told.append(n)
    )
    assert got == 30 and calls == [1, 2, 3] and told == [1, 2]
    calls.clear()
    with pytest.raises(ConnectionError, match="refused 2"):
        await retry_async(attempt, RetryPolicy(2, 0.0, 0.0), (ConnectionError,))
    assert calls == [1, 2]
    with pytest.raises(ConnectionError, match="refused 1"):
        await retry_async(attempt, RetryPolicy(2, 0.0, 0.0), (ValueError,))


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"max_attempts": 0}, "max_attempts >= 1"),
        ({"initial_delay_s": -1.0}, "delays >= 0"),
        ({"multiplier": 0.5}, "multiplier >= 1"),
    ],
)
def test_a_policy_that_cannot_work_is_refused(kwargs: dict, problem: str) -> None:
    values = {"max_attempts": 3, "initial_delay_s": 0.5, "max_delay_s": 8.0, **kwargs}
    with pytest.raises(ConfigError, match=problem):
        RetryPolicy(**values)
