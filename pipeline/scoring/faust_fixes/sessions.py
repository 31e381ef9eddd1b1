"""The pairing agent's session table: its durable copy never runs ahead of the pairs it implies.

Works around: faust-streaming writing a table's changelog record when a key is
set, independently of the agent's outputs (at-least-once mode; its
exactly-once mode, which would tie them in a transaction, loses or duplicates
under kill -9: robinhood/faust#340, faust-streaming #323, #517). Can go when
Faust can tie a changelog write to the delivery of an event's outputs.
Uses only public API of Faust (``Table.data``, ``Table.changelog_topic``); its records go out
with the agents' outputs, through the worker's sender.

Faust writes a table's changelog record the moment a key is set, before the
agent's outputs for the same record are stored. A worker killed in between
restarts with the new state (say, ``pending`` = turn 2) while the pair that
state change emitted (turn 1 with turn 2 as its next state) never reached the
broker; the re-read turn 2 is then a duplicate, and the pair is lost.

So the agent sets a session's new state in memory at once (the session's next
record needs it) and writes its changelog record only once the record's
outputs are stored (:meth:`SessionTable.persisting`, the durable step of
pipeline.scoring.faust_fixes.acks), and acknowledges its input only once that record
is stored too. A kill before the changelog record lands restarts from the
older state: the input is read again and its pairs emitted again (duplicates,
which downstream collapses by sample_id).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.deadletters import Out

if TYPE_CHECKING:
    from pipeline.scoring.faust_fixes.acks import Durable, Send


# The sessions one input changed: (partition, session_id) -> its new state (None: forget it).
SessionWrites = dict[tuple[int, str], dict[str, Any] | None]


class SessionTable:
    """A Faust table of session states, written in memory now and to its changelog later."""

    def __init__(self, table: Any, send: Send) -> None:
        # app.Table(...): its codecs and data are attributes of the class, on no Faust interface
        self.table = table
        self.send = send
        self.changelog = table.changelog_topic.get_topic_name()
        if (table.key_serializer, table.value_serializer) != ("json", "json"):
            raise TypeError("the session table's changelog is written as JSON: keep its codecs")

    def get(self, session_id: str) -> dict[str, Any] | None:
        return self.table.data.get(session_id)

    def set(self, session_id: str, state: dict[str, Any] | None) -> None:
        """The new state in memory only (None forgets the session)."""
        if state is None:
            self.table.data.pop(session_id, None)
        else:
            self.table.data[session_id] = state

    def record(self, partition: int, session_id: str, state: dict[str, Any] | None) -> Out:
        """The changelog record of ``state`` (a tombstone for None).

        ``partition`` is the input record's: a table's changelog is partitioned
        like the topic it is keyed from. Encoded as the table's JSON codec does
        (Faust's recovery reads it back), and sent as the agents' outputs are
        (straight to the producer; Faust's own table writes wait in its send buffer).
        """
        value = None if state is None else orjson.dumps(state)
        return Out(self.changelog, orjson.dumps(session_id), value, partition)

    def items(self) -> list[tuple[str, dict[str, Any]]]:
        return list(self.table.data.items())

    def persisting(self, writes: SessionWrites) -> Durable | None:
        """The durable step of one input: the new state of each session it changed, keyed
        by (partition, session_id) (None: no change)."""
        if not writes:
            return None

        async def persist_all() -> list[Awaitable[Any]]:
            return await self.send(
                [self.record(p, sid, state) for (p, sid), state in writes.items()]
            )

        return persist_all
