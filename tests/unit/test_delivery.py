"""Inputs are acknowledged only once their outputs are delivered, in arrival order."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.scoring.delivery import DeliveryFailed, InOrderAcks


async def test_acks_wait_for_delivery_and_keep_arrival_order() -> None:
    acked: list[str] = []
    acks = InOrderAcks(8, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()

    def then(name: str):  # type: ignore[no-untyped-def]
        async def ack() -> None:
            acked.append(name)

        return ack

    await acks.add([first], then("a"))
    await acks.add([second], then("b"))
    await acks.add([], then("c"))  # nothing to deliver: still after b
    second.set_result("b stored")  # the later one is stored first
    await asyncio.sleep(0.01)
    assert acked == []  # a's output is not stored yet: nothing may be acknowledged
    first.set_result("a stored")
    await asyncio.sleep(0.01)
    assert acked == ["a", "b", "c"]
    runner.cancel()


async def test_a_failed_delivery_stops_acknowledgements_and_is_reported() -> None:
    acked: list[str] = []
    failures: list[BaseException] = []
    acks = InOrderAcks(8, on_failure=failures.append)
    runner = asyncio.ensure_future(acks.run())
    loop = asyncio.get_running_loop()
    refused, fine = loop.create_future(), loop.create_future()
    fine.set_result("ok")

    async def ack_b() -> None:
        acked.append("b")

    async def ack_a() -> None:
        acked.append("a")

    await acks.add([fine, refused], ack_a)
    await acks.add([fine], ack_b)
    refused.set_exception(RuntimeError("MessageSizeTooLargeError"))
    await asyncio.wait_for(runner, 1)  # the runner stops at the failure
    assert acked == [] and [str(f) for f in failures] == ["MessageSizeTooLargeError"]
    with pytest.raises(DeliveryFailed, match="MessageSizeTooLarge"):
        await acks.add([], ack_b)
    assert acks.drop() == 2  # a and b stay unacknowledged: read again by the next owner


def test_a_sample_too_large_for_its_topic_is_a_dead_letter_not_a_refused_send() -> None:
    from pipeline.events import DeadLetter, NextState, Paired, Response, Turn, decode_as, encode
    from pipeline.scoring.score import RulesJudge
    from pipeline.scoring.stages import JudgeStage
    from pipeline.settings import Settings

    topics = Settings().topics
    stage = JudgeStage(topics, RulesJudge(), "rl")
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


async def test_the_durable_step_starts_only_once_outputs_are_stored_and_gates_the_ack() -> None:
    """A session-state change goes to the log after the pairs it implies, never before."""
    events: list[str] = []
    acks = InOrderAcks(8, on_failure=lambda exc: None)
    runner = asyncio.ensure_future(acks.run())
    loop = asyncio.get_running_loop()
    pair_a, pair_b = loop.create_future(), loop.create_future()
    state_a, state_b = loop.create_future(), loop.create_future()

    def durable(name: str, stored: asyncio.Future[str]):  # type: ignore[no-untyped-def]
        def start() -> list[asyncio.Future[str]]:
            events.append(f"write {name}")
            return [stored]

        return start

    def then(name: str):  # type: ignore[no-untyped-def]
        async def ack() -> None:
            events.append(f"ack {name}")

        return ack

    await acks.add([pair_a], then("a"), durable("a", state_a))
    await acks.add([pair_b], then("b"), durable("b", state_b))
    pair_b.set_result("stored")
    await asyncio.sleep(0.01)
    assert events == []  # a's pair is not stored: no state may be written, not even b's
    pair_a.set_result("stored")
    await asyncio.sleep(0.01)
    assert events == ["write a", "write b"]  # in arrival order, acks still held
    assert acks.pending == 2
    state_b.set_result("stored")
    await asyncio.sleep(0.01)
    assert events == ["write a", "write b"]  # b's state is stored, a's is not: no ack yet
    state_a.set_result("stored")
    await asyncio.sleep(0.01)
    assert events == ["write a", "write b", "ack a", "ack b"]
    assert acks.pending == 0
    runner.cancel()


async def test_a_refused_state_write_stops_acknowledgements_like_a_refused_output() -> None:
    failures: list[BaseException] = []
    acked: list[str] = []
    acks = InOrderAcks(8, on_failure=failures.append)
    runner = asyncio.ensure_future(acks.run())
    refused = asyncio.get_running_loop().create_future()
    refused.set_exception(RuntimeError("changelog refused"))

    async def ack() -> None:
        acked.append("a")

    await acks.add([], ack, lambda: [refused])
    await asyncio.wait_for(runner, 1)
    assert acked == [] and [str(f) for f in failures] == ["changelog refused"]
    assert acks.drop() == 1
