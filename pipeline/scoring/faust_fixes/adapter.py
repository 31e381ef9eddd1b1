"""The one place that touches faust-streaming's private consumer attributes.

Committing chosen offsets is not in Faust's public API: its consumer commits
only what its own ack tracking allows (see ``handover``). This module commits
through ``Consumer._commit`` and reads and records ``_committed_offset``, the
attributes of faust-streaming 0.15 (``faust/transport/consumer.py``); it also
hands out the aiokafka producer inside Faust's (``Producer._ensure_producer``), and
runs Faust's aiokafka consumer on the app's event loop (``InLoopConsumer``, below).
It checks the installed versions on import: an untested version is a clear error
here rather than a silent mis-commit later. Tested against real consumers in
``tests/kafka/test_faust_fixes.py``.

Can go when faust-streaming offers a public commit of explicit offsets and a
consumer on the app's loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from typing import Any

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as FaustConsumer
from mode.utils.loops import get_event_loop

from pipeline.library_versions import require_tested

TESTED = {
    "faust-streaming": ("0.15.",),
    "mode-streaming": ("0.7.",),  # InLoopConsumer: ServiceThread
    "aiokafka": ("0.12.", "0.13.", "0.14."),
}


def check_versions(installed: Mapping[str, str] | None = None) -> dict[str, str]:
    """The installed versions; ConfigError when one was never tested with this module's
    uses of Faust's internals (``installed``: versions to check instead)."""
    return require_tested(
        TESTED,
        "the scoring worker's use of Faust's internals (pipeline/scoring/faust_fixes/adapter.py)",
        "tests/kafka/test_faust_fixes.py",
        installed,
    )


VERSIONS = check_versions()


def committed_offset(consumer: Any, tp: Any) -> int:
    """The offset Faust last committed for ``tp`` (0 when none)."""
    return consumer._committed_offset.get(tp) or 0


async def commit(consumer: Any, offsets: dict[Any, int]) -> None:
    """Commit ``offsets`` (faust TP -> next offset) for the group, and tell Faust it did."""
    await consumer._commit(offsets)
    consumer._committed_offset.update(offsets)


async def seek(consumer: Any, tp: Any, offset: int) -> None:
    """Faust's ``Consumer.seek``, with aiokafka's seek run by the consumer's own thread
    (on the app's loop: ``InLoopConsumer``; in its own thread: Faust's consumer).

    Works around: faust-streaming's threaded consumer (``ThreadDelegateConsumer._seek``)
    calls aiokafka's ``seek`` from the app's thread while aiokafka's fetcher runs on the
    consumer thread; a seek landing while the fetcher hands out records crashes it
    (``KeyError`` in ``Fetcher.fetched_records``), and the worker then reads nothing
    more without exiting. Seen here in a benchmark run on a loaded machine.
    """
    from aiokafka.errors import IllegalStateError

    thread = consumer._thread
    try:
        await thread.call_thread(thread.seek, tp, offset)
    except IllegalStateError:  # revoked while the seek waited its turn: its new owner reads it
        return
    consumer._read_offset[tp] = offset if offset else None  # as Faust's seek does


def kafka_producer(app: Any) -> Any:
    """The aiokafka producer inside Faust's (``Producer._ensure_producer``): Faust's ``send``
    takes one record at a time, the worker sends whole record batches."""
    return app.producer._ensure_producer()


def fetcher_crash(app: Any) -> BaseException | None:
    """Why the app's fetcher (the service that drains fetched records) crashed, if it did:
    Faust logs the crash and keeps the worker up, reading nothing."""
    fetcher = app._fetcher
    return fetcher.crash_reason if fetcher.crashed else None


# The consumer on the app's loop.
#
# Works around: faust-streaming runs aiokafka's consumer in a thread of its own, with
# its own event loop (``AIOKafkaConsumerThread``, a mode ``ServiceThread``), and has
# no setting to run it on the app's loop. Every fetch is then two hand-offs between
# threads (the request through a method queue, the records back), and the two
# threads take turns at the GIL: with the worker busy, fetched records wait up to a
# switch interval (5 ms) before the app's loop sees them. On two cores at half the
# judge's capacity (benchmarks/latency.py) the pipeline's median went from 17.8 and
# 21.1 ms to 10.6 and 15.2 ms in alternating runs once the consumer ran on the loop.
#
# The repair: the same consumer class, started as a task of the app's loop instead
# of in a thread (its "thread loop" is the app's loop), and its calls "into the
# thread" are plain awaits. Can go with the rest of this module, when faust-streaming
# runs its consumer on the app's loop itself.


class _LoopTask:
    """In place of mode's ``WorkerThread``: the service runs as a task of its loop."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.task: asyncio.Task[Any] | None = None

    def start(self) -> None:
        self.task = self.service.parent_loop.create_task(self.service._serve())

    def stop(self) -> None:
        """mode joins its thread here; ``InLoopConsumerThread.stop`` awaits the task."""

    def is_alive(self) -> bool:
        return self.task is not None and not self.task.done()


class InLoopConsumerThread(AIOKafkaConsumerThread):
    """Faust's aiokafka consumer "thread", run on the app's loop."""

    def __init__(self, consumer: Any, *, loop: Any = None, **kwargs: Any) -> None:
        loop = loop or get_event_loop()
        # a loop passed in is not closed by mode when the service stops
        super().__init__(consumer, loop=loop, thread_loop=loop, Worker=_LoopTask, **kwargs)

    async def call_thread(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        result = fun(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result

    async def stop(self) -> None:
        await super().stop()
        task = self._thread.task if isinstance(self._thread, _LoopTask) else None
        if task is not None and task is not asyncio.current_task():
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # a crash is mode's to report (``_serve`` logs it), not ours

    async def _gather_remaining_tasks(self) -> None:
        """mode cancels every other task of the thread's loop here: those are the app's."""


class InLoopConsumer(FaustConsumer):
    """Faust's aiokafka consumer with its consumer "thread" on the app's loop."""

    def _new_consumer_thread(self) -> InLoopConsumerThread:
        return InLoopConsumerThread(self, loop=self.loop, beacon=self.beacon)


def consume_in_loop(app: Any) -> None:
    """The app's consumer runs on the app's loop (call before anything makes the consumer)."""
    if app._consumer is not None:
        raise RuntimeError("consume_in_loop: the app's consumer was already made")
    app.transport.Consumer = InLoopConsumer
