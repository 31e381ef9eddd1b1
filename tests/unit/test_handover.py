"""Handed-over positions: what a worker commits for partitions that move away."""

from __future__ import annotations

import asyncio
from typing import Any

from faust.types import TP

from pipeline.scoring.handover import Handled, commit_handed_over, commit_idle


def test_the_position_is_after_the_highest_handled_offset_per_partition() -> None:
    handled = Handled()
    for offset in (4, 5, 7, 6):
        handled.done("t", 0, offset)
    handled.done("t", 1, 2)
    assert handled.take({("t", 0), ("t", 1), ("t", 2)}) == {("t", 0): 8, ("t", 1): 3}
    assert handled.take({("t", 0)}) == {}  # taken once


def test_an_assignment_forgets_partitions_that_were_elsewhere() -> None:
    handled = Handled()
    handled.done("t", 0, 9)
    handled.done("t", 1, 9)
    handled.keep_only({("t", 1)})
    assert handled.take({("t", 0), ("t", 1)}) == {("t", 1): 10}


class _Buffer:
    def __init__(self, size: int) -> None:
        self.size = size


class _Producer:
    def __init__(self, unsent: int, drains: bool) -> None:
        self.buffer = _Buffer(unsent)
        self.drains = drains
        self.flushes = 0

    async def flush(self) -> None:
        self.flushes += 1
        if self.drains:
            self.buffer.size = max(0, self.buffer.size - 1)


class _Consumer:
    def __init__(self) -> None:
        self.commits: list[dict[TP, int]] = []
        self._committed_offset: dict[TP, int | None] = {}

    async def _commit(self, offsets: dict[TP, int]) -> bool:
        self.commits.append(dict(offsets))
        return True


class _App:
    def __init__(self, producer: _Producer) -> None:
        self.producer = producer
        self.consumer = _Consumer()


def _revoke(app: Any, handled: Handled, timeout_s: float = 30.0) -> dict:
    revoked = {TP("t", 0), TP("t", 1)}
    return asyncio.run(commit_handed_over(app, handled, revoked, timeout_s=timeout_s))


def test_positions_are_committed_only_after_the_producer_sent_everything() -> None:
    handled = Handled()
    handled.done("t", 0, 41)
    app = _App(_Producer(unsent=3, drains=True))
    assert _revoke(app, handled) == {("t", 0): 42}
    assert app.producer.buffer.size == 0 and app.producer.flushes >= 4
    assert app.consumer.commits == [{TP("t", 0): 42}]


def test_nothing_is_committed_while_records_stay_unsent() -> None:
    handled = Handled()
    handled.done("t", 1, 7)
    app = _App(_Producer(unsent=2, drains=False))
    assert _revoke(app, handled, timeout_s=0.05) == {}
    assert app.consumer.commits == []  # the next owner re-reads: duplicates, not a loss


def test_nothing_handled_commits_nothing() -> None:
    app = _App(_Producer(unsent=0, drains=True))
    assert _revoke(app, Handled()) == {}
    assert app.consumer.commits == []


def test_records_acknowledged_once_the_buffer_drained_are_handed_over_too() -> None:
    """An agent acknowledges a record once its outputs are delivered: a record whose
    outputs the drain delivered counts as handled before the positions are taken."""
    handled = Handled()
    handled.done("t", 0, 10)

    async def revoke() -> dict:
        app = _App(_Producer(unsent=2, drains=True))

        async def agent_acks() -> None:
            while app.producer.buffer.size:
                await asyncio.sleep(0)
            handled.done("t", 0, 11)  # delivered by the drain, then acknowledged

        acker = asyncio.ensure_future(agent_acks())
        await asyncio.sleep(0)
        got = await commit_handed_over(app, handled, {TP("t", 0)}, timeout_s=5)
        await acker
        return got

    assert asyncio.run(revoke()) == {("t", 0): 12}


def test_idle_positions_ahead_of_fausts_commit_are_committed_and_kept() -> None:
    handled = Handled()
    handled.done("t", 0, 86)  # read back by the guard: Faust's own commit stays at 43
    handled.done("t", 1, 9)
    app = _App(_Producer(unsent=1, drains=True))
    app.consumer._committed_offset = {TP("t", 0): 43, TP("t", 1): 10}
    assigned = {("t", 0), ("t", 1)}
    assert asyncio.run(commit_idle(app, handled, assigned)) == {("t", 0): 87}
    assert app.consumer.commits == [{TP("t", 0): 87}] and app.producer.buffer.size == 0
    assert app.consumer._committed_offset[TP("t", 0)] == 87  # Faust will not go below it
    assert asyncio.run(commit_idle(app, handled, assigned)) == {}  # nothing behind any more
    assert handled.positions(assigned) == {("t", 0): 87, ("t", 1): 10}  # still tracked


def test_idle_commit_waits_for_unsent_records() -> None:
    handled = Handled()
    handled.done("t", 0, 5)
    app = _App(_Producer(unsent=2, drains=False))
    assert asyncio.run(commit_idle(app, handled, {("t", 0)}, timeout_s=0.05)) == {}
    assert app.consumer.commits == []
