"""Acknowledge an input record only once everything it produced is on the broker.

Faust's ``topic.send`` returns as soon as a record is in the producer's buffer;
the broker's answer comes later, on a future. An agent that acknowledged its
input on return would let the consumer commit past a record whose outputs
were then refused or timed out (the failure is only logged): a loss.

:class:`InOrderAcks` holds each input's acknowledgement until its delivery
futures have all resolved, in arrival order, so a commit can never pass an
input whose outputs are not stored. A delivery that fails (after the
producer's own retries) stops the acknowledgements there and reports the
error: the worker stops, and whoever takes its partitions reads the
unacknowledged inputs again (duplicates, never a loss).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

Then = Callable[[], Awaitable[None]]


class DeliveryFailed(Exception):
    """An output could not be stored on the broker."""


class InOrderAcks:
    """Runs each input's ``then`` (its acknowledgement) once its outputs are delivered."""

    def __init__(self, limit: int, on_failure: Callable[[BaseException], Any]) -> None:
        self._queue: asyncio.Queue[tuple[list[Awaitable[Any]], Then]] = asyncio.Queue(limit)
        self._on_failure = on_failure
        self.failure: BaseException | None = None

    async def add(self, deliveries: list[Awaitable[Any]], then: Then) -> None:
        """Queue one input (waits while ``limit`` inputs are queued)."""
        if self.failure is not None:
            raise DeliveryFailed(f"an earlier output was not delivered: {self.failure!r}")
        await self._queue.put((deliveries, then))

    def drop(self) -> int:
        """Forget every queued input (the agent stops; they stay unacknowledged)."""
        dropped = 0
        while not self._queue.empty():
            self._queue.get_nowait()
            dropped += 1
        return dropped

    async def run(self) -> None:
        """Acknowledge in order until a delivery fails (then report it and stop)."""
        while True:
            deliveries, then = await self._queue.get()
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
                    return
            await then()
