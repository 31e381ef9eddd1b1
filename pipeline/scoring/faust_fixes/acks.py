"""Acknowledge an input record only once everything it produced is on the broker.

Works around: faust-streaming's ``topic.send`` returning once a record is
buffered, while its stream acknowledges (and later commits) an event when the
agent moves on; a send the broker refuses afterwards is only logged
(``Producer`` callbacks in ``faust/transport/producer.py``). Can go when a
Faust agent can acknowledge an event on its outputs' delivery.

Faust's ``topic.send`` returns as soon as a record is in the producer's buffer;
the broker's answer comes later, on a future. An agent that acknowledged its
input on return would let the consumer commit past a record whose outputs
were then refused or timed out (the failure is only logged): a loss.

:class:`InOrderAcks` takes each input's outputs (or the task that will
produce them), sends them as soon as they exist, and holds the input's
acknowledgement, in arrival order, until they are stored, so a commit can
never pass an input whose outputs are not stored. An input may also carry a *durable step*
(the pairing agent's session-state change): it is started only once the
input's outputs are stored, in arrival order, and the input is acknowledged
only once the step is stored too. State on the log therefore never implies an
output that is not (a worker killed in between restarts from older state and
emits the output again: a duplicate, never a loss). An input is whatever the
agent acknowledges at once: one record, or a burst of records read together.

A delivery that fails (after the producer's own retries) stops the
acknowledgements there and reports the error: the worker stops, and whoever
takes its partitions reads the unacknowledged inputs again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.deadletters import Out
from pipeline.errors import BrokerError

log = logging.getLogger(__name__)

Then = Callable[[], Awaitable[None]]
# started once an input's outputs are stored; returns what resolves once it is stored
Durable = Callable[[], Awaitable[list[Awaitable[Any]]]]
# hands outputs to the producer; returns what resolves once each is stored
Send = Callable[[list[Out]], Awaitable[list[Awaitable[Any]]]]


class DeliveryFailed(BrokerError):
    """An output could not be stored on the broker."""


@dataclass
class _Input:
    then: Then
    durable: Durable | None
    records: int  # the input records it stands for
    slots: int  # of the window they hold
    task: asyncio.Future[list[Out]] | None = None  # outputs still being made
    sent: asyncio.Future[list[Awaitable[Any]]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class InOrderAcks:
    """Sends each input's outputs and runs its ``then`` (its acknowledgement) once stored.

    Outputs are handed to the producer as soon as they exist (a pair judged
    quickly does not wait behind a slow one); in arrival order, once an input's
    outputs are stored its durable step starts, and once that is stored the input
    is acknowledged. An input may stand for several records (a burst the agent
    read together: one send, one durable step, one acknowledgement); at most
    ``limit`` records are between :meth:`add` and their acknowledgement (``add``
    waits).
    """

    def __init__(self, limit: int, send: Send, on_failure: Callable[[BaseException], Any]) -> None:
        self._send = send
        self._on_failure = on_failure
        self._slots = asyncio.Semaphore(limit)
        self._ready: asyncio.Queue[tuple[_Input, list[Out]]] = asyncio.Queue()
        self._arrived: asyncio.Queue[_Input] = asyncio.Queue()
        self._durable: asyncio.Queue[tuple[list[Awaitable[Any]], _Input]] = asyncio.Queue()
        self.failure: BaseException | None = None
        self.limit = limit
        self.pending = 0  # records added and not yet acknowledged

    async def add(
        self,
        outputs: list[Out] | asyncio.Future[list[Out]],
        then: Then,
        durable: Durable | None = None,
        records: int = 1,
    ) -> None:
        """Queue one input of ``records`` records (waits while the window is full; an input
        larger than the window waits for all of it)."""
        if self.failure is not None:
            raise DeliveryFailed(f"an earlier output was not delivered: {self.failure!r}")
        slots = min(records, self.limit)
        for _ in range(slots):
            await self._slots.acquire()
        self.pending += records
        item = _Input(then, durable, records, slots)
        if isinstance(outputs, list):
            self._ready.put_nowait((item, outputs))
        else:
            item.task = outputs
            outputs.add_done_callback(lambda task: self._made(item, task))
        self._arrived.put_nowait(item)

    def _made(self, item: _Input, task: asyncio.Future[list[Out]]) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:  # the stages catch their errors: a bug
            item.sent.set_exception(task.exception())  # type: ignore[arg-type]
            return
        self._ready.put_nowait((item, task.result()))

    def drop(self) -> int:
        """Forget every input not yet acknowledged (the agent stops; they stay unacknowledged)."""
        while not self._arrived.empty():
            item = self._arrived.get_nowait()
            if item.task is not None:
                item.task.cancel()
        for queue in (self._ready, self._durable):
            while not queue.empty():
                queue.get_nowait()
        dropped, self.pending = self.pending, 0
        return dropped

    async def run(self) -> None:
        """Send and acknowledge until a delivery fails (then report it and stop)."""
        stages = [asyncio.ensure_future(s()) for s in (self._sending, self._storing, self._acking)]
        try:
            done, _ = await asyncio.wait(stages, return_when=asyncio.FIRST_COMPLETED)
            for stage in done:
                stage.result()
        finally:
            for stage in stages:
                stage.cancel()

    async def _sending(self) -> None:
        """Outputs to the producer in the order they were made."""
        while True:
            item, outs = await self._ready.get()
            try:
                item.sent.set_result(await self._send(outs))
            except Exception as exc:  # refused before it was even buffered
                self._failed(exc)
                return

    async def _storing(self) -> None:
        """In arrival order: outputs stored, then the input's durable step."""
        while True:
            item = await self._arrived.get()
            try:
                stored = await item.sent
            except Exception as exc:
                self._failed(exc)
                return
            if not await self._all_stored(stored):
                return
            try:
                writes = await item.durable() if item.durable else []
            except Exception as exc:  # refused before it was even buffered
                self._failed(exc)
                return
            self._durable.put_nowait((writes, item))

    async def _acking(self) -> None:
        while True:
            stored, item = await self._durable.get()
            if not await self._all_stored(stored):
                return
            self.pending -= item.records
            for _ in range(item.slots):
                self._slots.release()
            await item.then()

    async def _all_stored(self, deliveries: list[Awaitable[Any]]) -> bool:
        for delivery in deliveries:
            try:
                await delivery
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
                return False
        return True

    def _failed(self, exc: BaseException) -> None:
        self.failure = exc
        log.error(
            "an output was not delivered to Kafka (%r): its input and every later one stay "
            "unacknowledged, to be read again",
            exc,
        )
        self._on_failure(exc)
