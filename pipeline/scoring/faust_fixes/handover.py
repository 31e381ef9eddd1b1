"""Handover: commit what this worker handled, where Faust's own commit cannot.

Works around: faust-streaming double-processing after a scale-out rebalance
(faust-streaming #502) and its commit never passing records it did not
deliver itself (see ``guard``). Can go when Faust commits the acked offsets of
revoked partitions before giving them up, and the guard is gone.

When a rebalance revokes partitions, faust-streaming (0.15) drops its record of
the offsets acked on them *before* its own final commit runs, so that commit
carries nothing for them and the next owner judges everything since the last
periodic commit a second time. And records the guard read back were never
delivered by Faust, so its commit stops in front of them for good: a later kill
or rebalance then re-judges everything since.

``Handled`` keeps, per partition, the offset after the last record
acknowledged, and a record is acknowledged only once its outputs and session
state are stored (``acks``): a handled position is always safe to commit.
``commit_ahead`` commits the positions Faust's commit is behind, every second;
``commit_handed_over`` commits the positions of revoked partitions, after the
agents have acknowledged what they were finishing (a few seconds at most).
Committing only what was stored keeps the guarantee at-least-once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from pipeline.scoring.faust_fixes import adapter

if TYPE_CHECKING:
    from faust.types import TP, AppT

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (topic, partition)


class Handled:
    """Per partition: the offset after the last record fully handled (outputs sent)."""

    def __init__(self) -> None:
        self._next: dict[Key, int] = {}

    def done(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self._next[key] = max(self._next.get(key, 0), offset + 1)

    def take(self, revoked: set[Key]) -> dict[Key, int]:
        """The positions of ``revoked`` partitions, forgotten here."""
        return {key: self._next.pop(key) for key in revoked if key in self._next}

    def positions(self, keys: set[Key]) -> dict[Key, int]:
        """The positions of ``keys`` (kept here)."""
        return {key: self._next[key] for key in keys if key in self._next}

    def keep_only(self, assigned: set[Key]) -> None:
        """After an assignment: positions of partitions held elsewhere meanwhile are stale."""
        self._next = {key: o for key, o in self._next.items() if key in assigned}


async def commit_ahead(app: AppT, handled: Handled, assigned: set[Key]) -> dict[Key, int]:
    """Commit the handled positions of ``assigned`` that Faust's own commit is behind."""
    from faust.types import TP

    consumer = app.consumer
    behind = {
        key: position
        for key, position in handled.positions(assigned).items()
        if adapter.committed_offset(consumer, TP(*key)) < position
    }
    if behind:
        await adapter.commit(consumer, {TP(t, p): offset for (t, p), offset in behind.items()})
        log.debug("committed %d partition position(s) ahead of Faust's", len(behind))
    return behind


async def commit_handed_over(
    app: AppT,
    handled: Handled,
    revoked: Iterable[TP],
    settled: Callable[[], Awaitable[Any]] | None = None,
) -> dict[Key, int]:
    """Commit the handled positions of ``revoked`` (faust TPs) through Faust's consumer.

    ``settled`` waits (briefly) for the agents to acknowledge what they were
    finishing, so the next owner starts after it rather than judging it again.
    """
    from faust.types import TP

    if settled is not None:
        await settled()
    positions = handled.take({(tp.topic, tp.partition) for tp in revoked})
    if not positions:
        return {}
    await adapter.commit(app.consumer, {TP(t, p): o for (t, p), o in positions.items()})
    log.info("committed %d handed-over partition position(s)", len(positions))
    return positions


async def exit_after_refused_output(app: AppT, handled: Handled, exc: BaseException) -> None:
    """Stop this worker after an output was refused: commit what was delivered, then exit 1.

    Not Faust's graceful stop: it waits for its unacknowledged records to be
    acknowledged, and the ones behind the refused output never will be. Whoever
    takes the partitions reads them again from the commit.
    """
    await exit_now(
        app, handled, f"an output could not be delivered to Kafka ({exc!r}); its input and "
        "everything after it are read again from the last commit",
    )  # fmt: skip


async def exit_now(app: AppT, handled: Handled, why: str) -> None:
    """Commit the positions handled (within 15 s), say ``why`` on stderr, and exit 1."""
    import os
    import sys

    log.error("stopping the worker: %s", why)
    try:
        assigned = app.consumer.assignment()
        await asyncio.wait_for(commit_handed_over(app, handled, assigned), 15)
    except Exception as commit_exc:  # the broker may be the problem: the last commit stands
        log.warning("could not commit the delivered positions before stopping: %r", commit_exc)
    sys.stderr.write(f"error: stopped: {why}\n")
    sys.stderr.flush()
    logging.shutdown()
    os._exit(1)
