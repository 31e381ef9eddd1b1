"""Hand each fetched record to the streams without four tasks per record.

Works around: faust-streaming's ``Consumer._drain_messages`` delivers every
record through ``wait_first(callback(message), suspend_flow.wait())``, which
starts four tasks (the delivery and the flow, stopped and crashed events), an
``asyncio.wait``, and then cancels three of them: about a tenth of a scoring
worker's CPU at full load. That call is the one in faust-streaming #229;
robinhood/faust #563 measures Faust reading at a tenth of aiokafka's rate.
Can go when faust-streaming delivers a record without the race when nothing
can interrupt it.

The repair: while the flow runs and the consumer is neither stopping nor
crashed, the delivery takes its first step at once. Most deliveries end there
(the stream's buffer has room). A delivery that has to wait continues as a
task raced against the events, exactly as Faust races it. The first step then
runs in the drain loop's task and the rest in the race's: fine for Faust's
``on_message``, which neither enters ``asyncio.timeout`` nor sets context
variables (tested on Python 3.11 with faust-streaming 0.15). It checks the
installed versions on import: the repair leans on Faust's consumer's
``wait_first``, ``suspend_flow`` and ``should_stop`` and on mode's
``WaitResults``. Tested by tests/unit/test_drain.py over mode's real services
and tests/kafka/test_faust_fixes.py in a worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator, Mapping
from typing import Any

from mode.services import WaitResults

from pipeline.library_versions import require_tested

TESTED: dict[str, tuple[str, ...]] = {"faust-streaming": ("0.15.",), "mode-streaming": ("0.7.",)}


def check_versions(installed: Mapping[str, str] | None = None) -> dict[str, str]:
    """The installed versions; ConfigError when one was never tested with this repair
    (``installed``: versions to check instead)."""
    return require_tested(
        TESTED,
        "the quick delivery of fetched records (pipeline/scoring/faust_fixes/drain.py)",
        "tests/unit/test_drain.py and tests/kafka/test_faust_fixes.py",
        installed,
    )


VERSIONS = check_versions()


class _Rest:
    """The rest of a coroutine that took its first step and is waiting on ``waiting``."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, Any]:
        coro, waiting = self.coro, self.waiting
        while True:
            try:
                yield waiting
            except GeneratorExit:  # closed unfinished: close the delivery too
                coro.close()
                raise
            except BaseException as exc:  # cancelled while waiting: the delivery's to handle
                try:
                    waiting = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                waiting = coro.send(None)
            except StopIteration as stop:
                return stop.value


def install(consumer: Any) -> None:
    """Give ``consumer`` (a Faust consumer) the quick delivery of its records."""
    race = consumer.wait_first

    async def wait_first(*coros: Any, timeout: float | None = None) -> Any:
        if len(coros) != 2 or timeout is not None or not asyncio.iscoroutine(coros[0]):
            return await race(*coros, timeout=timeout)
        delivery, flow = coros
        if consumer.suspend_flow.is_set() or consumer.should_stop:
            return await race(delivery, flow)
        try:
            waiting = delivery.send(None)
        except StopIteration as done:
            _close(flow)
            return WaitResults([delivery], [done.value], False)
        except BaseException:
            _close(flow)
            raise
        return await race(_Rest(delivery, waiting), flow)

    consumer.wait_first = wait_first


def _close(awaitable: Any) -> None:
    if asyncio.iscoroutine(awaitable):
        awaitable.close()  # never started: nothing to clean up, and no "never awaited" warning
