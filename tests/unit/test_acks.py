"""Inputs are acknowledged only once their outputs (and state) are stored, in arrival order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.deadletters import Out
from pipeline.scoring.faust_fixes.acks import DeliveryFailed, InOrderAcks
from tests.loop import settle


class Producer:
    """Stands in for the producer: each output's delivery future, resolved by the test."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.stored: dict[str, asyncio.Future[str]] = {}

    async def send(self, outs: list[Out]) -> list[asyncio.Future[str]]:
        futures = []
        for out in outs:
            name = out.value.decode()
            self.sent.append(name)
            futures.append(self.stored.setdefault(name, asyncio.get_running_loop().create_future()))
        return futures

    def store(self, name: str, exc: BaseException | None = None) -> None:
        future = self.stored.setdefault(name, asyncio.get_running_loop().create_future())
        if exc is None:
            future.set_result("stored")
        else:
            future.set_exception(exc)


def out(name: str) -> Out:
    return Out("t", None, name.encode())


def recorder(log: list[str]):  # type: ignore[no-untyped-def]
    def then(name: str):  # type: ignore[no-untyped-def]
        async def ack() -> None:
            log.append(f"ack {name}")

        return ack

    return then


async def test_acks_wait_for_delivery_and_keep_arrival_order() -> None:
    acked: list[str] = []
    producer = Producer()
    acks = InOrderAcks(8, producer.send, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    then = recorder(acked)
    await acks.add([out("a")], then("a"))
    await acks.add([out("b")], then("b"))
    await acks.add([], then("c"))  # nothing to deliver: still after b
    await settle()
    assert producer.sent == ["a", "b"]  # both sent at once: a send never waits for a delivery
    producer.store("b")  # the later one is stored first
    await settle()
    assert acked == []  # a's output is not stored yet: nothing may be acknowledged
    producer.store("a")
    await settle()
    assert acked == ["ack a", "ack b", "ack c"]
    assert acks.pending == 0
    runner.cancel()


async def test_outputs_made_later_are_sent_at_once_and_acknowledged_in_arrival_order() -> None:
    """A pair judged faster than the one before it is sent at once (no head-of-line wait for
    its sample); the input is still acknowledged only after the slower one before it."""
    acked: list[str] = []
    producer = Producer()
    acks = InOrderAcks(8, producer.send, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    loop = asyncio.get_running_loop()
    slow, fast = loop.create_future(), loop.create_future()
    await acks.add(slow, recorder(acked)("slow"))
    await acks.add(fast, recorder(acked)("fast"))
    fast.set_result([out("fast")])
    await settle()
    assert producer.sent == ["fast"]
    producer.store("fast")
    await settle()
    assert acked == []  # the slow one before it is not even made
    slow.set_result([out("slow")])
    await settle()
    assert producer.sent == ["fast", "slow"] and acked == []
    producer.store("slow")
    await settle()
    assert acked == ["ack slow", "ack fast"]
    runner.cancel()


async def test_at_most_limit_inputs_wait_unacknowledged() -> None:
    producer = Producer()
    acks = InOrderAcks(2, producer.send, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    then = recorder([])
    await acks.add([out("a")], then("a"))
    await acks.add([out("b")], then("b"))
    third = asyncio.ensure_future(acks.add([out("c")], then("c")))
    await settle()
    assert not third.done() and acks.pending == 2  # backpressure: the agent stops reading
    producer.store("a")
    await settle()
    assert third.done() and acks.pending == 2
    runner.cancel()


async def test_a_burst_holds_one_slot_per_record_and_is_acknowledged_once() -> None:
    acked: list[str] = []
    producer = Producer()
    acks = InOrderAcks(4, producer.send, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    then = recorder(acked)
    await acks.add([out("a1"), out("a2")], then("a1+a2+a3"), records=3)
    assert acks.pending == 3
    second = asyncio.ensure_future(acks.add([out("b1"), out("b2")], then("b1+b2"), records=2))
    await settle()
    assert not second.done(), "3 + 2 records in a window of 4: the second burst waits"
    producer.store("a1")
    await settle()
    assert acked == [] and not second.done(), "one of the burst's outputs is not stored yet"
    producer.store("a2")
    await settle()
    assert acked == ["ack a1+a2+a3"] and second.done() and acks.pending == 2
    producer.store("b1")
    producer.store("b2")
    await settle()
    assert acked == ["ack a1+a2+a3", "ack b1+b2"] and acks.pending == 0
    runner.cancel()


async def test_a_burst_larger_than_the_window_waits_for_all_of_it() -> None:
    acked: list[str] = []
    producer = Producer()
    acks = InOrderAcks(2, producer.send, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    then = recorder(acked)
    await acks.add([out("a")], then("a"))
    big = asyncio.ensure_future(acks.add([out("b")], then("b: 5 records"), records=5))
    await settle()
    assert not big.done()
    producer.store("a")
    await settle()
    assert big.done() and acks.pending == 5, "the whole window, then the burst goes in"
    nxt = asyncio.ensure_future(acks.add([out("c")], then("c")))
    await settle()
    assert not nxt.done()
    producer.store("b")
    producer.store("c")
    await settle()
    assert nxt.done() and acked == ["ack a", "ack b: 5 records", "ack c"] and acks.pending == 0
    runner.cancel()


async def test_a_failed_delivery_stops_acknowledgements_and_is_reported() -> None:
    acked: list[str] = []
    failures: list[BaseException] = []
    producer = Producer()
    acks = InOrderAcks(8, producer.send, on_failure=failures.append)
    runner = asyncio.ensure_future(acks.run())
    then = recorder(acked)
    await acks.add([out("fine"), out("refused")], then("a"))
    await acks.add([out("fine2")], then("b"))
    producer.store("fine")
    producer.store("fine2")
    producer.store("refused", RuntimeError("MessageSizeTooLargeError"))
    await asyncio.wait_for(runner, 1)  # the runner stops at the failure
    assert acked == [] and [str(f) for f in failures] == ["MessageSizeTooLargeError"]
    with pytest.raises(DeliveryFailed, match="MessageSizeTooLarge"):
        await acks.add([], then("c"))
    assert acks.drop() == 2  # a and b stay unacknowledged: read again by the next owner


async def test_a_send_refused_before_buffering_is_a_failed_delivery() -> None:
    failures: list[BaseException] = []

    async def refuse(outs: list[Out]) -> list[Any]:
        raise RuntimeError("producer closed")

    acks = InOrderAcks(8, refuse, on_failure=failures.append)
    runner = asyncio.ensure_future(acks.run())
    await acks.add([out("a")], recorder([])("a"))
    await asyncio.wait_for(runner, 1)
    assert [str(f) for f in failures] == ["producer closed"]


async def test_the_durable_step_starts_only_once_outputs_are_stored_and_gates_the_ack() -> None:
    """A session-state change goes to the log after the pairs it implies, never before."""
    events: list[str] = []
    producer = Producer()
    acks = InOrderAcks(8, producer.send, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    loop = asyncio.get_running_loop()
    state_a, state_b = loop.create_future(), loop.create_future()

    def durable(name: str, stored: asyncio.Future[str]):  # type: ignore[no-untyped-def]
        async def start() -> list[asyncio.Future[str]]:
            events.append(f"write {name}")
            return [stored]

        return start

    then = recorder(events)
    await acks.add([out("pair a")], then("a"), durable("a", state_a))
    await acks.add([out("pair b")], then("b"), durable("b", state_b))
    producer.store("pair b")
    await settle()
    assert events == []  # a's pair is not stored: no state may be written, not even b's
    producer.store("pair a")
    await settle()
    assert events == ["write a", "write b"]  # in arrival order, acks still held
    assert acks.pending == 2
    state_b.set_result("stored")
    await settle()
    assert events == ["write a", "write b"]  # b's state is stored, a's is not: no ack yet
    state_a.set_result("stored")
    await settle()
    assert events == ["write a", "write b", "ack a", "ack b"]
    assert acks.pending == 0
    runner.cancel()


async def test_a_refused_state_write_stops_acknowledgements_like_a_refused_output() -> None:
    failures: list[BaseException] = []
    acked: list[str] = []
    acks = InOrderAcks(8, Producer().send, on_failure=failures.append)
    runner = asyncio.ensure_future(acks.run())
    refused = asyncio.get_running_loop().create_future()
    refused.set_exception(RuntimeError("changelog refused"))

    async def write() -> list[asyncio.Future[str]]:
        return [refused]

    await acks.add([], recorder(acked)("a"), write)
    await asyncio.wait_for(runner, 1)
    assert acked == [] and [str(f) for f in failures] == ["changelog refused"]
    assert acks.drop() == 1


def test_a_sample_too_large_for_its_topic_is_a_dead_letter_not_a_refused_send() -> None:
    from pipeline.events import DeadLetter, NextState, Paired, Response, Turn, decode_as, encode
    from pipeline.judge.rules import RulesJudge
    from pipeline.scoring.scorers import PrmScorer
    from pipeline.scoring.stages import JudgeStage
    from pipeline.settings import Settings

    topics = Settings().topics
    stage = JudgeStage(topics, PrmScorer(RulesJudge(), "rl"))
    stage.dead.limits[topics.samples_scored.name] = 4_000  # as if samples.scored were small
    turn = Turn(
        type="turn",
        session_id="s",
        ts=1.0,
        turn_index=0,
        turn_type="main",
        messages=[{"role": "user", "content": "q"}],
        response=Response(content="x" * 5_000),
    )
    pair = Paired(
        sample_id="s:0",
        turn=turn,
        next_state=NextState(role="user", content="thanks"),
        first_judged=True,
        paired_ts=1.0,
    )
    [out] = asyncio.run(stage.handle(encode(pair), b"s", "turns.paired/0/9"))
    assert out.topic == topics.deadletter.name
    letter = decode_as(DeadLetter, out.value)
    assert letter.stage == "score" and letter.source == "turns.paired/0/9"
    assert topics.samples_scored.name in letter.error and "max.message.bytes" in letter.error
