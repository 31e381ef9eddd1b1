"""Pair each main turn with its next state: the pure core of the pairing agent.

Per session the agent keeps a :class:`SessionState` (in a Faust table, keyed by
session_id, so a session's events arrive in order on one partition):

- a main turn waits as ``pending`` until the next main turn arrives (its next
  state is that turn's last message, when its role is ``user`` or ``tool``), or
  a ``message`` event arrives (that message is the next state), whichever
  comes first;
- ``session_end`` (from the app, or a worker's idle timeout) flushes the
  pending turn with no next state and forgets the session;
- ``side`` turns never become samples;
- a turn whose (session, turn_index) was already seen is a duplicate and is
  ignored; a turn older than the newest one seen, but not seen before, arrived
  out of order: its next state can no longer be known, so it is rejected
  (dead-lettered with that reason) rather than paired wrongly;
- a rollout attempt's turns (``turn.rollout``, from the proxy's rollout route)
  are paired as any others, but their pairs are *held* in the state until the
  session ends: an end with reason ``client`` (the attempt succeeded) emits
  them with the end's ``rollout_metrics``; ``rollout_failed`` (or an idle
  timeout: the rollout stage never said it succeeded) emits them marked
  ``exclude_reason: rollout_failed``, so no sample trains from a failed
  attempt. The held pairs are bounded by the rollout's ``max_turns``. A
  successful end's task ground truth goes onto each of its turns, and its last
  pair is marked ``rollout_final`` with the rollout's messages: reward
  processors score the whole rollout on it, next state or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.events import Message, NextState, Paired, SessionEnd, Turn

Outcome = Literal[
    "pending",
    "paired",
    "side",
    "duplicate",
    "out_of_order",
    "ended",
    "idle_ended",
    "stale_idle",
    "no_pending",
    "ignored_end",
    "held",
    "rollout_ended",
    "rollout_failed",
]


@dataclass
class SessionState:
    """What the pairing agent remembers of one session (stored as a dict)."""

    pending: dict[str, Any] | None = None  # the waiting main turn, as its JSON
    seen: list[int] = field(default_factory=list)  # turn indices seen, main and side
    judged: bool = False  # a pair with a next state was emitted already
    last_seen: float = 0.0  # wall-clock time of the session's last event
    rollout: bool = False  # a rollout attempt's session: its pairs wait for its end
    held: list[dict[str, Any]] = field(default_factory=list)  # those pairs, as their JSON

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pending": self.pending,
            "seen": self.seen,
            "judged": self.judged,
            "last_seen": self.last_seen,
        }
        if self.rollout:  # a plain session's stored state keeps the shape it had
            out.update(rollout=True, held=self.held)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SessionState:
        """A state to step from; ``data`` is never changed (it may be waiting to be stored)."""
        if not data:
            return cls()
        return cls(
            data["pending"],
            list(data["seen"]),
            data["judged"],
            data["last_seen"],
            bool(data.get("rollout", False)),
            list(data.get("held", [])),
        )


@dataclass(frozen=True)
class Step:
    """The result of one event: new state (None = forget), pairs to emit, what happened."""

    state: SessionState | None
    pairs: list[Paired]
    outcome: Outcome
    reject_reason: str | None = None


def next_state_of(turn: Turn) -> NextState | None:
    """The next state a main turn gives its predecessor: its last message, if user or tool."""
    last = turn.messages[-1]
    if last.role not in ("user", "tool"):
        return None
    return NextState(
        role=last.role, content=last.content, name=last.name, tool_call_id=last.tool_call_id
    )


def _pair(state: SessionState, next_state: NextState | None, now: float) -> Paired:
    assert state.pending is not None
    turn = Turn.model_validate(state.pending)
    first_judged = next_state is not None and not state.judged
    if next_state is not None:
        state.judged = True
    return Paired(
        sample_id=turn.sample_id,
        turn=turn,
        next_state=next_state,
        first_judged=first_judged,
        paired_ts=now,
    )


def pair_step(
    state: SessionState | None,
    event: Turn | Message | SessionEnd,
    now: float,
    idle_timeout_s: float,
) -> Step:
    """Apply one input event to a session's state."""
    st = state or SessionState()
    if isinstance(event, Turn):
        return _on_turn(st, event, now)
    if isinstance(event, Message):
        st.last_seen = now
        if st.pending is None:
            return Step(st, [], "no_pending")
        pair = _pair(st, event.message, now)
        st.pending = None
        return _emit(st, [pair], "paired")
    if event.reason == "idle_timeout" and st.last_seen > event.ts - idle_timeout_s:
        return Step(st, [], "stale_idle")  # the session moved on after the timer looked
    if state is None:
        return Step(None, [], "ignored_end")
    pairs = [_pair(st, None, now)] if st.pending is not None else []
    if st.rollout:
        return _end_rollout(st, pairs, event)
    return Step(None, pairs, "idle_ended" if event.reason == "idle_timeout" else "ended")


def _emit(st: SessionState, pairs: list[Paired], outcome: Outcome) -> Step:
    """``pairs`` sent on, or held in ``st`` until a rollout session's end."""
    if not st.rollout or not pairs:
        return Step(st, pairs, outcome)
    st.held.extend(p.model_dump(mode="json") for p in pairs)
    return Step(st, [], "held")


def _end_rollout(st: SessionState, last: list[Paired], end: SessionEnd) -> Step:
    """A rollout session's held pairs (and its last turn's): trained with the rollout's
    metrics when it succeeded, excluded as ``rollout_failed`` when it failed or went idle."""
    pairs = [Paired.model_validate(p) for p in st.held] + last
    if end.reason != "client":
        failed = [p.model_copy(update={"exclude_reason": "rollout_failed"}) for p in pairs]
        return Step(None, failed, "rollout_failed")
    update: dict[str, Any] = {"rollout_metrics": dict(end.rollout_metrics)}
    done = [_with_ground_truth(p.model_copy(update=update), end.ground_truth) for p in pairs]
    if done:
        final = {"rollout_final": True, "rollout_messages": end.agent_messages}
        done[-1] = done[-1].model_copy(update=final)
    return Step(None, done, "rollout_ended")


def _with_ground_truth(pair: Paired, ground_truth: Any) -> Paired:
    """``pair`` with the rollout task's ground truth on its turn (a turn's own is kept)."""
    if ground_truth is None or pair.turn.ground_truth is not None:
        return pair
    return pair.model_copy(
        update={"turn": pair.turn.model_copy(update={"ground_truth": ground_truth})}
    )


def _on_turn(st: SessionState, turn: Turn, now: float) -> Step:
    index = turn.turn_index
    if index in st.seen:
        return Step(st, [], "duplicate")
    if st.seen and index < max(st.seen):
        reason = (
            f"turn_index {index} of session {turn.session_id} arrived after turn "
            f"{max(st.seen)}: out of order, so its next state cannot be known"
        )
        return Step(st, [], "out_of_order", reason)
    st.seen.append(index)
    st.last_seen = now
    st.rollout = st.rollout or turn.rollout
    if turn.turn_type == "side":
        return Step(st, [], "side")
    pairs = [_pair(st, next_state_of(turn), now)] if st.pending is not None else []
    st.pending = turn.model_dump(mode="json")
    return _emit(st, pairs, "paired" if pairs else "pending")
