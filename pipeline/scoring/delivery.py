"""Acknowledge an input record only once everything it produced is on the broker.

Faust's ``topic.send`` returns as soon as a record is in the producer's buffer;
the broker's answer comes later, on a future. An agent that acknowledged its
input on return would let the consumer commit past a record whose outputs
were then refused or timed out (the failure is only logged): a loss.

:class:`InOrderAcks` holds each input's acknowledgement until its delivery
futures have all resolved, in arrival order, so a commit can never pass an
input whose outputs are not stored. An input may also carry a *durable step*
(the pairing agent's session-state change): it is started only once the
input's outputs are stored, in arrival order, and the input is acknowledged
only once the step is stored too. State on the log therefore never implies an
output that is not (a worker killed in between restarts from older state and
emits the output again: a duplicate, never a loss).

A delivery that fails (after the producer's own retries) stops the
acknowledgements there and reports the error: the worker stops, and whoever
takes its partitions reads the unacknowledged inputs again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.errors import BrokerError

log = logging.getLogger(__name__)

Then = Callable[[], Awaitable[None]]
# started once an input's outputs are stored; returns what resolves once it is stored
Durable = Callable[[], list[Awaitable[Any]]]


class DeliveryFailed(BrokerError):
    """An output could not be stored on the broker."""


class InOrderAcks:
    """Runs each input's ``then`` (its acknowledgement) once its outputs are delivered."""

    def __init__(self, limit: int, on_failure: Callable[[BaseException], Any]) -> None:
        self._delivering: asyncio.Queue[tuple[list[Awaitable[Any]], Durable | None, Then]]
        self._delivering = asyncio.Queue(limit)
        self._storing: asyncio.Queue[tuple[list[Awaitable[Any]], Then]] = asyncio.Queue(limit)
        self._on_failure = on_failure
        self.failure: BaseException | None = None
        self.pending = 0  # inputs added and not yet acknowledged

    async def add(
        self, deliveries: list[Awaitable[Any]], then: Then, durable: Durable | None = None
    ) -> None:
        """Queue one input (waits while ``limit`` inputs are queued)."""
        if self.failure is not None:
            raise DeliveryFailed(f"an earlier output was not delivered: {self.failure!r}")
        self.pending += 1
        await self._delivering.put((deliveries, durable, then))

    def drop(self) -> int:
        """Forget every input not yet acknowledged (the agent stops; they stay unacknowledged)."""
        for queue in (self._delivering, self._storing):
            while not queue.empty():
                queue.get_nowait()
        dropped, self.pending = self.pending, 0
        return dropped

    async def run(self) -> None:
        """Acknowledge in order until a delivery fails (then report it and stop)."""
        stages = [asyncio.ensure_future(self._deliver()), asyncio.ensure_future(self._store())]
        try:
            done, _ = await asyncio.wait(stages, return_when=asyncio.FIRST_COMPLETED)
            for stage in done:
                stage.result()
        finally:
            for stage in stages:
                stage.cancel()

    async def _deliver(self) -> None:
        while True:
            deliveries, durable, then = await self._delivering.get()
            if not await self._stored(deliveries):
                return
            await self._storing.put((durable() if durable else [], then))

    async def _store(self) -> None:
        while True:
            durable, then = await self._storing.get()
            if not await self._stored(durable):
                return
            self.pending -= 1
            await then()

    async def _stored(self, deliveries: list[Awaitable[Any]]) -> bool:
        for delivery in deliveries:
            try:
                await delivery
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failure = exc
                log.error(
                    "an output was not delivered to Kafka (%r): its input and every "
                    "later one stay unacknowledged, to be read again",
                    exc,
                )
                self._on_failure(exc)
                return False
        return True
