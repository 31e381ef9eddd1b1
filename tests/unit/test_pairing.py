from __future__ import annotations

import orjson

from pipeline.events import Message, SessionEnd, Turn, decode_input
from pipeline.scoring.pairing import SessionState, pair_step
from tests.conftest import REPO

IDLE = 1800.0


def turn(index: int, last_role: str = "user", content: str = "q", kind: str = "main") -> Turn:
    event = decode_input(
        orjson.dumps(
            {
                "type": "turn",
                "session_id": "s",
                "turn_index": index,
                "turn_type": kind,
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": last_role, "content": content},
                ],
                "response": {"content": f"answer {index}"},
                "ts": 100.0 + index,
            }
        )
    )
    assert isinstance(event, Turn)
    return event


def message(content: str, role: str = "user") -> Message:
    return Message(
        type="message", session_id="s", ts=50.0, message={"role": role, "content": content}
    )  # type: ignore[arg-type]


def end(reason: str = "client", ts: float = 0.0) -> SessionEnd:
    return SessionEnd(type="session_end", session_id="s", ts=ts, reason=reason)  # type: ignore[arg-type]


def run(events, start: float = 1000.0):  # type: ignore[no-untyped-def]
    state: SessionState | None = None
    pairs, outcomes = [], []
    for i, event in enumerate(events):
        step = pair_step(state, event, now=start + i, idle_timeout_s=IDLE)
        state = step.state
        pairs.extend(step.pairs)
        outcomes.append(step.outcome)
    return pairs, outcomes, state


def test_next_main_turn_supplies_the_next_state() -> None:
    pairs, outcomes, state = run([turn(0), turn(1, content="No, that's wrong")])
    assert outcomes == ["pending", "paired"]
    assert [p.sample_id for p in pairs] == ["s:0"]
    assert pairs[0].next_state is not None and pairs[0].next_state.content == "No, that's wrong"
    assert pairs[0].first_judged is True
    assert state is not None and state.pending is not None and state.pending["turn_index"] == 1


def test_tool_result_is_a_next_state_and_only_the_first_pair_is_first_judged() -> None:
    pairs, _, _ = run([turn(0), turn(1, last_role="tool", content="exit 0"), turn(2)])
    assert [(p.next_state.role, p.first_judged) for p in pairs] == [  # type: ignore[union-attr]
        ("tool", True),
        ("user", False),
    ]


def test_message_event_comes_first_and_the_next_turn_does_not_pair_again() -> None:
    pairs, outcomes, _ = run([turn(0), message("thanks!"), turn(1), end()])
    assert outcomes == ["pending", "paired", "pending", "ended"]
    assert [(p.sample_id, p.next_state and p.next_state.content) for p in pairs] == [
        ("s:0", "thanks!"),
        ("s:1", None),
    ]
    assert pairs[1].first_judged is False


def test_side_turns_never_pair() -> None:
    pairs, outcomes, _ = run([turn(0), turn(1, kind="side"), turn(2, content="next q")])
    assert outcomes == ["pending", "side", "paired"]
    assert [(p.sample_id, p.next_state.content) for p in pairs] == [("s:0", "next q")]  # type: ignore[union-attr]


def test_session_end_flushes_without_next_state_and_forgets() -> None:
    pairs, outcomes, state = run([turn(0), end()])
    assert outcomes == ["pending", "ended"] and state is None
    assert pairs[0].next_state is None and pairs[0].first_judged is False


def test_assistant_last_message_gives_no_next_state() -> None:
    pairs, _, _ = run([turn(0), turn(1, last_role="assistant")])
    assert pairs[0].next_state is None


def test_duplicates_are_ignored_and_late_turns_rejected() -> None:
    state: SessionState | None = None
    for event in (turn(0), turn(2)):
        state = pair_step(state, event, 1.0, IDLE).state
    dup = pair_step(state, turn(2), 2.0, IDLE)
    assert dup.outcome == "duplicate" and dup.pairs == []
    late = pair_step(dup.state, turn(1), 3.0, IDLE)
    assert late.outcome == "out_of_order" and late.pairs == []
    assert late.reject_reason and "turn_index 1" in late.reject_reason
    assert "after turn 2" in late.reject_reason


def test_idle_end_flushes_only_a_session_that_is_still_idle() -> None:
    state = pair_step(None, turn(0), now=1000.0, idle_timeout_s=IDLE).state
    stale = pair_step(state, end("idle_timeout", ts=1000.0 + IDLE - 5), 2900.0, IDLE)
    assert stale.outcome == "stale_idle" and stale.pairs == []
    idle = pair_step(state, end("idle_timeout", ts=1000.0 + IDLE + 1), 2900.0, IDLE)
    assert idle.outcome == "idle_ended" and idle.state is None
    assert idle.pairs[0].next_state is None


def test_end_of_unknown_session_and_message_without_pending() -> None:
    assert pair_step(None, end(), 1.0, IDLE).outcome == "ignored_end"
    assert pair_step(None, message("hi"), 1.0, IDLE).outcome == "no_pending"


def test_state_round_trips_through_a_dict() -> None:
    _, _, state = run([turn(0), turn(1)])
    assert state is not None
    assert SessionState.from_dict(orjson.loads(orjson.dumps(state.to_dict()))) == state


def test_every_main_turn_of_the_examples_is_paired_once() -> None:
    states: dict[str, SessionState | None] = {}
    pairs = []
    mains = 0
    for line in (REPO / "examples" / "sessions.jsonl").read_bytes().splitlines():
        event = decode_input(line)
        if isinstance(event, Turn) and event.turn_type == "main":
            mains += 1
        step = pair_step(states.get(event.session_id), event, 1.0, IDLE)
        states[event.session_id] = step.state
        assert step.outcome not in ("duplicate", "out_of_order")
        pairs.extend(step.pairs)
    ids = [p.sample_id for p in pairs]
    assert len(ids) == len(set(ids)) == mains
    firsts = {p.turn.session_id for p in pairs if p.first_judged}
    assert len(firsts) == len({p.turn.session_id for p in pairs if p.next_state})


def test_a_stored_state_is_never_changed_by_the_steps_after_it() -> None:
    """The worker writes a state to the changelog only once its pairs are stored, so the
    dict of one step may still be waiting while later events of the session step on."""
    import copy

    first = pair_step(None, turn(0), 1.0, IDLE).state
    assert first is not None
    waiting = first.to_dict()
    snapshot = copy.deepcopy(waiting)
    state = SessionState.from_dict(waiting)
    for event in (turn(1), message("thanks"), turn(2), end()):
        step = pair_step(state, event, 2.0, IDLE)
        state = step.state
    assert waiting == snapshot
