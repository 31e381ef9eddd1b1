"""Faust repairs over mode's real services: the quick delivery of fetched records
(faust_fixes.drain), and stopping a worker whose fetcher crashed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mode import Service
from mode.utils.locks import Event

from pipeline.scoring.faust_fixes import drain


class Consumer(Service):
    """What Faust's consumer offers the repair: wait_first, should_stop and suspend_flow."""

    def __init__(self) -> None:
        super().__init__()
        self.suspend_flow = Event()
        self.raced = 0
        race = self.wait_first

        async def counted(*coros: Any, timeout: float | None = None) -> Any:
            self.raced += 1
            return await race(*coros, timeout=timeout)

        self.wait_first = counted  # type: ignore[method-assign]
        drain.install(self)


async def test_a_delivery_that_need_not_wait_ends_without_a_race() -> None:
    consumer = Consumer()
    delivered = []

    async def deliver(n: int) -> int:
        delivered.append(n)
        return n * 2

    results = await consumer.wait_first(deliver(3), consumer.suspend_flow.wait())
    assert (delivered, results.results, results.stopped, consumer.raced) == ([3], [6], False, 0)


async def test_a_delivery_that_waits_is_raced_and_finishes() -> None:
    consumer = Consumer()
    room: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
    room.put_nowait(0)  # full: the delivery has to wait for a get

    async def deliver() -> str:
        await room.put(1)
        return "in"

    async def make_room() -> None:
        await asyncio.sleep(0.01)
        room.get_nowait()

    helper = asyncio.ensure_future(make_room())
    results = await consumer.wait_first(deliver(), consumer.suspend_flow.wait())
    await helper
    assert (results.results, consumer.raced, room.get_nowait()) == (["in"], 1, 1)


async def test_a_suspended_flow_interrupts_a_waiting_delivery_as_faust_does() -> None:
    consumer = Consumer()
    cleaned = []

    async def deliver() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append("cancelled inside")

    async def suspend() -> None:
        await asyncio.sleep(0.01)
        consumer.suspend_flow.set()

    helper = asyncio.ensure_future(suspend())
    results = await asyncio.wait_for(
        consumer.wait_first(deliver(), consumer.suspend_flow.wait()), 5
    )
    await helper
    await asyncio.sleep(0)  # the race cancels the losing delivery
    assert (results.results, results.stopped, consumer.raced) == ([True], False, 1)
    assert cleaned == ["cancelled inside"]


async def test_stopping_the_drain_loop_cancels_a_waiting_delivery_inside() -> None:
    consumer = Consumer()
    cleaned = []
    blocked = asyncio.Event()

    async def deliver() -> None:
        try:
            blocked.set()
            await asyncio.sleep(30)
        finally:
            cleaned.append("cancelled inside")

    drain_loop = asyncio.ensure_future(consumer.wait_first(deliver(), consumer.suspend_flow.wait()))
    await blocked.wait()
    drain_loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await drain_loop
    await asyncio.sleep(0)
    assert cleaned == ["cancelled inside"]


async def test_a_suspended_flow_takes_faust_s_own_race() -> None:
    consumer = Consumer()
    consumer.suspend_flow.set()

    async def deliver() -> int:
        return 1

    await consumer.wait_first(deliver(), consumer.suspend_flow.wait())
    assert consumer.raced == 1


async def test_a_delivery_s_error_is_raised_to_the_drain_loop() -> None:
    consumer = Consumer()

    async def deliver() -> None:
        raise ValueError("bad record")

    with pytest.raises(ValueError, match="bad record"):
        await consumer.wait_first(deliver(), consumer.suspend_flow.wait())


async def test_a_worker_whose_fetcher_crashed_exits_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Faust logs a fetcher's crash, which crashes the app (and stops its timers), and
    keeps the process up reading nothing: the worker's loop timer stops it instead, so
    that its partitions move to one that reads."""
    from types import SimpleNamespace

    import faust

    from pipeline.scoring import upkeep
    from pipeline.scoring.faust_fixes.handover import Handled

    exits: list[str] = []

    async def exit_now(_app: Any, _handled: Any, why: str) -> None:
        exits.append(why)

    looked: list[bool] = []  # what each of the watcher's looks found: crashed or not
    stop_if_crashed = upkeep.stop_if_crashed

    def looking(w: Any) -> bool:
        looked.append(stop_if_crashed(w))
        return looked[-1]

    async def until(check: Any) -> None:
        deadline = asyncio.get_running_loop().time() + 30
        while not check():
            assert asyncio.get_running_loop().time() < deadline, f"looks: {looked}"
            await asyncio.sleep(0.01)

    monkeypatch.setattr(upkeep, "exit_now", exit_now)
    monkeypatch.setattr(upkeep, "stop_if_crashed", looking)
    app = faust.App("crash-watch", broker="kafka://127.0.0.1:1", datadir=str(tmp_path))
    w: Any = SimpleNamespace(app=app, handled=Handled(), stopping=[])
    upkeep.watch_for_crash(w, 0.01)
    await until(lambda: len(looked) >= 3)  # the marker: it has looked, and looked again
    assert not exits and not w.stopping  # nothing crashed: it keeps watching
    assert looked == [False] * len(looked)
    await app._fetcher.crash(KeyError("TopicPartition(topic='t', partition=7)"))
    assert app.crashed  # the fetcher's crash takes the app with it
    await until(lambda: True in looked)  # a later look sees the crash
    await asyncio.gather(*w.stopping)
    assert len(w.stopping) == 1 and len(exits) == 1
    assert "Faust crashed (KeyError(" in exits[0]
