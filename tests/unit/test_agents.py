"""The Faust agents' wiring, through agent.test_context() (in-memory channels)."""

from __future__ import annotations

import asyncio

import orjson

from pipeline.deadletters import Out
from pipeline.events import DeadLetter, Paired, Sample, decode_as, encode
from pipeline.scoring.judge.rules import RulesJudge
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


def app_with_sink():  # type: ignore[no-untyped-def]
    sent: list[Out] = []
    changelog: list[Out] = []

    async def sink(outs: list[Out]) -> list[object]:
        sent.extend(o for o in outs if not o.topic.endswith("-changelog"))
        changelog.extend(o for o in outs if o.topic.endswith("-changelog"))
        stored = asyncio.get_running_loop().create_future()
        stored.set_result("stored")
        return [stored] * len(outs)

    app = build_app(SETTINGS, RulesJudge(), sender=sink)
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
    # the table's changelog gets each state once its pairs are stored, as JSON, in order
    written = [orjson.loads(o.value) for o in changelog if o.key == b'"s1"']
    assert [w["pending"]["turn_index"] for w in written] == [0, 1]
    assert written[0]["seen"] == [0]  # the first state as it was, not as the next step left it


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


async def test_tombstones_are_dead_lettered_not_fatal() -> None:
    app, sent, _changelog = app_with_sink()
    async with app.agents["pair"].test_context() as agent:
        await agent.put(None, key=b"s1")
        await agent.put(turn(0, "q"), key=b"s1")
    assert [o.topic for o in sent] == ["tc.pipeline.deadletter"]
    assert "no value" in decode_as(DeadLetter, sent[0].value).error
    assert app.tables["sessions"].get("s1") is not None  # the next event still paired
