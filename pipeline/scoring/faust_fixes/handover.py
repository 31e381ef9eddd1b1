"""Handover: commit what this worker handled before its partitions move to another.

Works around: faust-streaming double-processing after a scale-out rebalance
(faust-streaming #502) and its commit never passing records it did not
deliver itself (see ``guard``). Can go when Faust commits the acked offsets of
revoked partitions before giving them up, and the guard is gone.

When a rebalance revokes partitions, faust-streaming (0.15) drops its record of
the offsets acked on them *before* its own final commit runs, so that commit
carries nothing for them: the group's offset stays at the last timer commit
(every 2.8 s, longer under load) and the next owner judges everything since
then a second time. Seen when a second worker joins mid-run: hundreds of
duplicate samples, each one m judge calls spent twice.

``Handled`` keeps, per partition, the offset after the last record
acknowledged (its outputs and session state stored: ``acks``);
``commit_handed_over`` waits until the producer has sent everything and then
commits those offsets for the revoked partitions. ``commit_idle`` does the
same for a worker with nothing in flight whose Faust commit is stuck in front
of records the offset guard read back.
Committing only what was delivered keeps the guarantee at-least-once: a record
is never committed before its outputs are on the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pipeline.scoring.faust_fixes import adapter

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


async def _drained(app: Any, timeout_s: float, what: str) -> bool:
    """Whether the producer's buffer emptied within ``timeout_s`` (then flushed)."""
    producer = app.producer
    deadline = time.monotonic() + timeout_s
    while producer.buffer.size and time.monotonic() < deadline:
        await producer.flush()
    if producer.buffer.size:
        log.warning(
            "not committing %s: %d record(s) still unsent after %.0fs",
            what,
            producer.buffer.size,
            timeout_s,
        )
        return False
    await producer.flush()
    return True


async def commit_idle(
    app: Any, handled: Handled, assigned: set[Key], timeout_s: float = 30.0
) -> dict[Key, int]:
    """While nothing is in flight: commit handled positions that Faust's commit is behind.

    Faust commits only offsets it delivered and saw acked; records the offset guard
    read back for it never were, so its commit stops in front of them for good (the
    group's lag never reaches 0, and a restart would judge everything since again).
    """
    from faust.types import TP

    consumer = app.consumer
    behind = {
        key: position
        for key, position in handled.positions(assigned).items()
        if adapter.committed_offset(consumer, TP(*key)) < position
    }
    if not behind or not await _drained(app, timeout_s, "positions of idle partitions"):
        return {}
    await adapter.commit(consumer, {TP(t, p): offset for (t, p), offset in behind.items()})
    log.info("committed %d idle partition position(s) ahead of Faust's", len(behind))
    return behind


async def commit_handed_over(
    app: Any, handled: Handled, revoked: Any, timeout_s: float = 30.0
) -> dict[Key, int]:
    """Commit the handled positions of ``revoked`` (faust TPs) through Faust's consumer.

    Only once the producer's buffer is empty: table changelog writes wait there,
    and Faust's own flush gives up after 0.1 s without a send. A position committed
    before the session state that goes with it is on the log would let the next
    owner restore an older state. If the buffer does not drain in ``timeout_s``,
    nothing is committed (the next owner re-reads: duplicates, never a loss).
    """
    from faust.types import TP

    revoked_keys = {(tp.topic, tp.partition) for tp in revoked}
    if not await _drained(app, timeout_s, "handed-over positions"):
        handled.take(revoked_keys)
        return {}
    await asyncio.sleep(0)  # the agents acknowledge what the drained buffer delivered
    positions = handled.take(revoked_keys)
    if not positions:
        return {}
    await adapter.commit(app.consumer, {TP(t, p): o for (t, p), o in positions.items()})
    log.info("committed %d handed-over partition position(s)", len(positions))
    return positions


async def exit_after_refused_output(app: Any, handled: Handled, exc: BaseException) -> None:
    """Stop this worker after an output was refused: commit what was delivered, then exit 1.

    Not Faust's graceful stop: it waits for its unacknowledged records to be
    acknowledged, and the ones behind the refused output never will be. Whoever
    takes the partitions reads them again from the commit.
    """
    import os
    import sys

    log.error("stopping the worker: an output could not be delivered (%r)", exc)
    try:
        assigned = app.consumer.assignment()
        await asyncio.wait_for(commit_handed_over(app, handled, assigned, timeout_s=10), 15)
    except Exception as commit_exc:  # the broker may be the problem: the last commit stands
        log.warning("could not commit the delivered positions before stopping: %r", commit_exc)
    sys.stderr.write(
        f"error: stopped: an output could not be delivered to Kafka ({exc!r}); "
        "its input and everything after it are read again from the last commit\n"
    )
    sys.stderr.flush()
    logging.shutdown()
    os._exit(1)
