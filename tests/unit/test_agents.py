"""The Faust agents' wiring, through agent.test_context() (in-memory channels)."""

from __future__ import annotations

import asyncio

import orjson

from pipeline.deadletters import Out
from pipeline.events import DeadLetter, Paired, Sample, decode_as, encode
from pipeline.judge.rules import RulesJudge
from pipeline.scoring.faust_fixes.guard import OffsetGuard, Record
from pipeline.scoring.metrics import REDELIVERED
from pipeline.scoring.scorers import PrmScorer
from pipeline.scoring.stages import JudgeStage
from pipeline.scoring.worker import build_app
from pipeline.settings import KafkaSettings, Settings

SETTINGS = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"), topic_prefix="tc.")


def turn(index: int, last: str) -> bytes:
    return orjson.dumps(
        {
            "type": "turn",
            "session_id": "s1",
            "turn_index": index,
            "turn_type": "main",
            "messages": [{"role": "user", "content": last}],
            "response": {"content": "a"},
            "ts": 1.0,
        }
    )


def app_with_sink(guard: OffsetGuard | None = None):  # type: ignore[no-untyped-def]
    sent: list[Out] = []
    changelog: list[Out] = []

    async def sink(outs: list[Out]) -> list[object]:
        sent.extend(o for o in outs if not o.topic.endswith("-changelog"))
        changelog.extend(o for o in outs if o.topic.endswith("-changelog"))
        stored = asyncio.get_running_loop().create_future()
        stored.set_result("stored")
        return [stored] * len(outs)

    judging = JudgeStage(SETTINGS.topics, PrmScorer(RulesJudge(), "rl"))
    app = build_app(SETTINGS, judging, sender=sink, guard=guard)
    app.finalize()
    app.flow_control.resume()
    return app, sent, changelog


async def test_pair_agent_pairs_in_order_and_keeps_state_in_the_table() -> None:
    app, sent, changelog = app_with_sink()
    async with app.agents["pair"].test_context() as agent:
        await agent.put(turn(0, "run the tests"), key=b"s1")
        assert sent == []
        await agent.put(turn(1, "thanks, perfect"), key=b"s1")
        await agent.put(b"{broken", key=b"s1")
    assert [o.topic for o in sent] == ["tc.turns.paired", "tc.pipeline.deadletter"]
    pair = decode_as(Paired, sent[0].value)
    assert pair.sample_id == "s1:0" and pair.next_state.content == "thanks, perfect"  # type: ignore[union-attr]
    assert sent[0].key == b"s1"
    letter = decode_as(DeadLetter, sent[1].value)
    assert letter.stage == "pair" and "not valid JSON" in letter.error
    state = app.tables["sessions"].get("s1")
    assert state["pending"]["turn_index"] == 1 and state["seen"] == [0, 1]
    # the table's changelog gets the states once their pairs are stored, as JSON, in order:
    # one per record, or the last of a burst's (records read together write a session once)
    written = [orjson.loads(o.value) for o in changelog if o.key == b'"s1"']
    indexes = [w["pending"]["turn_index"] for w in written]
    assert indexes in ([0, 1], [1])
    for w in written:  # each state as it was when written, not as a later step left it
        assert w["seen"] == list(range(w["pending"]["turn_index"] + 1))


async def test_judge_agent_scores_and_emits_in_order() -> None:
    app, sent, _changelog = app_with_sink()
    pairs = []
    for i, reply in enumerate(["thanks!", "No, that's wrong", "ok then"]):
        turn_event = orjson.loads(turn(i, "q"))
        pairs.append(
            Paired.model_validate(
                {
                    "sample_id": f"s1:{i}",
                    "turn": turn_event,
                    "next_state": {"role": "user", "content": reply},
                    "first_judged": i == 0,
                    "paired_ts": 2.0,
                }
            )
        )
    async with app.agents["judge"].test_context() as agent:
        for pair in pairs:
            await agent.put(encode(pair), key=b"s1")
        for _ in range(100):
            if len(sent) == 3:
                break
            await asyncio.sleep(0.01)
    samples = [decode_as(Sample, o.value) for o in sent]
    assert [s.sample_id for s in samples] == ["s1:0", "s1:1", "s1:2"]
    assert [(s.score, s.loss_mask, s.exclude_reason) for s in samples] == [
        (1.0, 1, None),
        (-1.0, 1, None),
        (0.0, 0, "neutral_score"),
    ]


async def test_records_delivered_again_are_judged_once_and_acknowledged() -> None:
    """faust-streaming can deliver a kept partition again from its commit after a
    rebalance: the guard knows what this worker saw, and the agent judges it once."""

    def never_read(*_args: object) -> list[Record]:
        raise AssertionError("nothing was skipped: nothing to read back")

    guard = OffsetGuard(lambda keys: {key: 0 for key in keys}, never_read)
    app, sent, _changelog = app_with_sink(guard)
    reply = {"role": "user", "content": "thanks!"}
    pairs = [
        encode(
            Paired.model_validate(
                {
                    "sample_id": f"s1:{i}",
                    "turn": orjson.loads(turn(i, "q")),
                    "next_state": reply,
                    "first_judged": i == 0,
                    "paired_ts": 2.0,
                }
            )
        )
        for i in range(3)
    ]
    before = REDELIVERED.labels("tc.turns.paired")._value.get()
    async with app.agents["judge"].test_context() as agent:
        acked = []
        for value in pairs[:2]:
            acked.append(await agent.put(value, key=b"s1"))
        agent.sent_offset = 0  # delivered again from offset 0, then the next record
        for value in pairs:
            acked.append(await agent.put(value, key=b"s1"))
        for _ in range(200):
            if len(sent) == 3 and all(e.message.acked for e in acked):
                break
            await asyncio.sleep(0.01)
    assert [decode_as(Sample, o.value).sample_id for o in sent] == ["s1:0", "s1:1", "s1:2"]
    assert [e.message.offset for e in acked] == [0, 1, 0, 1, 2]
    assert all(e.message.acked for e in acked)  # the second deliveries too
    assert REDELIVERED.labels("tc.turns.paired")._value.get() - before == 2


async def test_tombstones_are_dead_lettered_not_fatal() -> None:
    app, sent, _changelog = app_with_sink()
    async with app.agents["pair"].test_context() as agent:
        await agent.put(None, key=b"s1")
        await agent.put(turn(0, "q"), key=b"s1")
    assert [o.topic for o in sent] == ["tc.pipeline.deadletter"]
    assert "no value" in decode_as(DeadLetter, sent[0].value).error
    assert app.tables["sessions"].get("s1") is not None  # the next event still paired
