"""What a scoring worker's two agents share: the stages, the session table, the outputs and
the repairs, with the events in flight between them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import faust
from faust.types import EventT, StreamT, TopicT

from pipeline.deadletters import Out
from pipeline.scoring import metrics
from pipeline.scoring.bursts import BURST_MAX, bursts
from pipeline.scoring.faust_fixes.acks import InOrderAcks, Send, Then
from pipeline.scoring.faust_fixes.guard import OffsetGuard, Record
from pipeline.scoring.faust_fixes.handover import Handled, exit_after_refused_output
from pipeline.scoring.faust_fixes.sessions import SessionTable, SessionWrites
from pipeline.scoring.stages import JudgeStage, PairingStage
from pipeline.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Worker:
    """What both agents share: the stages, the session table, the outputs, the repairs."""

    settings: Settings
    app: faust.App
    turns: TopicT  # the chat.turns topic (the idle sweep writes session ends to it)
    pairing: PairingStage
    judging: JudgeStage
    sessions: SessionTable
    send: Send
    guard: OffsetGuard | None = None
    on_delivery_failure: Callable[[BaseException], None] | None = None
    handled: Handled = field(default_factory=Handled)
    acks: list[InOrderAcks] = field(default_factory=list)
    stopping: list[asyncio.Future[None]] = field(default_factory=list)
    taken: int = 0  # events the agents read and have not yet handed to their ``acks``

    @property
    def in_flight(self) -> int:
        """Events the agents hold unacknowledged: read into a burst, or being handled."""
        return self.taken + sum(acks.pending for acks in self.acks)

    def took(self, events: int) -> None:
        """Count events read from a stream (negative: handed on, or dropped)."""
        self.taken += events

    def bursts(self, stream: StreamT) -> AsyncIterator[list[EventT]]:
        """``stream``'s events in bursts of at most ``BURST_MAX`` (and the window), counted
        in ``in_flight``."""
        return bursts(stream, min(BURST_MAX, self.settings.scoring.window), self.took)

    async def settled(self, timeout_s: float) -> None:
        """Until nothing is in flight, or ``timeout_s`` passed."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    def undelivered(self, exc: BaseException) -> None:
        if self.on_delivery_failure is not None:
            self.on_delivery_failure(exc)
        elif not self.stopping:
            self.stopping.append(
                asyncio.ensure_future(exit_after_refused_output(self.app, self.handled, exc))
            )

    @asynccontextmanager
    async def acknowledging(
        self, stream: StreamT
    ) -> AsyncIterator[tuple[InOrderAcks, Callable[[list[EventT]], Then]]]:
        """One agent's in-order acknowledgements, running for as long as the agent does."""
        acks = InOrderAcks(self.settings.scoring.window, self.send, self.undelivered)
        self.acks.append(acks)

        def then(events: list[EventT]) -> Then:
            async def ack() -> None:
                for event in events:
                    await stream.ack(event)
                    m = event.message
                    self.handled.done(m.topic, m.partition, m.offset)

            return ack

        runner = asyncio.ensure_future(acks.run())
        try:
            yield acks, then
        finally:
            runner.cancel()
            if acks.drop() and self.guard is not None:
                self.guard.reset()  # what it dropped is read back, not taken for seen

    async def records(self, events: list[EventT]) -> list[Record]:
        """The records of a burst of events, each after those before it that the stream
        skipped (read back by the guard); none for an event delivered again (``seen``)."""
        records = []
        guard, again = self.guard, 0
        for event in events:
            m = event.message
            if guard is not None:
                if guard.seen(m.topic, m.partition, m.offset):
                    metrics.REDELIVERED.labels(m.topic).inc()
                    again += 1
                    continue
                records += await guard.missing(m.topic, m.partition, m.offset)
            records.append(Record(m.topic, m.partition, m.offset, event.key, event.value))
        if again:
            log.info("%d record(s) delivered again, already handled here: not handled twice", again)
        return records

    def pair_record(self, raw: bytes | None, key: bytes | None, where: str, partition: int,
                    outs: list[Out], writes: SessionWrites) -> None:  # fmt: skip
        """Pair one record: its pairs to ``outs``, its session's new state to ``writes``."""
        result = self.pairing.handle(raw, key, where, self.sessions.get)
        if result.session_id is not None:
            state = None if result.forget else result.state
            self.sessions.set(result.session_id, state)
            writes[partition, result.session_id] = state
        outs.extend(result.outs)

    def judge_records(self, records: list[Record]) -> asyncio.Future[list[Out]]:
        """Judge records at the same time (their judge calls share requests); their outputs
        in the records' order."""

        async def judge_all() -> list[Out]:
            handle = self.judging.handle
            made = await asyncio.gather(*(handle(r.value, r.key, r.where) for r in records))
            return [out for outs in made for out in outs]

        return asyncio.ensure_future(judge_all())
