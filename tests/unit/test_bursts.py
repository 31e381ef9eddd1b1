"""An agent's bursts never wait on the stream for more than what is already waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pipeline.scoring.bursts import bursts
from tests.loop import settle


class Stream:
    """Stands in for a Faust stream: ``events()`` yields what it is given, and its queue
    says what Faust still holds (which Faust may drop without yielding it)."""

    def __init__(self, held: int = 0) -> None:
        self.feed: asyncio.Queue[Any] = asyncio.Queue()
        self.channel = self
        self.queue = asyncio.Queue()  # Faust's stream buffer: only its emptiness is read
        for i in range(held):
            self.queue.put_nowait(i)

    async def events(self) -> AsyncIterator[Any]:
        while True:
            item = await self.feed.get()
            if isinstance(item, BaseException):
                raise item
            yield item


async def test_a_burst_is_yielded_when_the_stream_drops_what_it_held() -> None:
    """A rebalance clears Faust's queue: the records it held never come. The burst already
    read must still be handed on (the rebalance waits for its acknowledgement)."""
    stream = Stream(held=3)  # Faust holds 3 more, but will drop them
    for name in ("a", "b"):
        stream.feed.put_nowait(name)
    got = bursts(stream, 16)  # type: ignore[arg-type]
    first = await asyncio.wait_for(got.__anext__(), timeout=2)
    assert first == ["a", "b"]
    await got.aclose()


async def test_events_already_read_come_together_up_to_the_limit() -> None:
    stream = Stream()
    for i in range(10):
        stream.feed.put_nowait(i)
    got = bursts(stream, 4)  # type: ignore[arg-type]
    seen = [await asyncio.wait_for(got.__anext__(), timeout=2) for _ in range(3)]
    assert seen[0] == [0, 1, 2, 3] and [x for b in seen for x in b] == list(range(10))
    assert all(len(b) <= 4 for b in seen)
    await got.aclose()


async def test_a_failing_stream_fails_the_agent() -> None:
    stream = Stream()
    stream.feed.put_nowait(RuntimeError("stream crashed"))
    got = bursts(stream, 4)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="stream crashed"):
        await asyncio.wait_for(got.__anext__(), timeout=2)


async def test_events_read_ahead_count_as_held_until_the_agent_is_done_with_them() -> None:
    """A rebalance waits for what the agents hold: events read into the inbox count from the
    moment they are read, until the agent comes back for the next burst (or stops)."""
    held = 0

    def count(n: int) -> None:
        nonlocal held
        held += n

    stream = Stream()
    for i in range(6):
        stream.feed.put_nowait(i)
    got = bursts(stream, 4, count)  # type: ignore[arg-type]
    first = await asyncio.wait_for(got.__anext__(), timeout=2)
    await settle()  # the reader fills the inbox behind the burst
    assert first == [0, 1, 2, 3] and held == 6  # the burst, and the two read behind it
    second = await asyncio.wait_for(got.__anext__(), timeout=2)
    assert second == [4, 5] and held == 2  # the first burst was handed on
    stream.feed.put_nowait(6)
    await settle()
    assert held == 3
    await got.aclose()  # the agent stops: nothing it read is held any more
    assert held == 0
