"""OffsetGuard: records a stream skipped are read back, in order, once."""

from __future__ import annotations

import asyncio
import time

from pipeline.scoring.faust_fixes.guard import OffsetGuard, Record


class FakeLog:
    def __init__(self, starts: dict[tuple[str, int], int]) -> None:
        self.starts = starts
        self.start_calls = 0
        self.reads: list[tuple[str, int, int, int]] = []

    def start_offsets(self, _keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.start_calls += 1
        return dict(self.starts)

    def read_range(self, topic: str, partition: int, first: int, end: int) -> list[Record]:
        self.reads.append((topic, partition, first, end))
        return [Record(topic, partition, o, b"k", b"v%d" % o) for o in range(first, end)]


def offsets_read(guard: OffsetGuard, topic: str, partition: int, offset: int) -> list[int]:
    return [r.offset for r in asyncio.run(guard.missing(topic, partition, offset))]


def test_a_stream_that_starts_at_the_committed_offset_needs_nothing() -> None:
    log = FakeLog({("t", 0): 37})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    assert [offsets_read(guard, "t", 0, o) for o in (37, 38, 39)] == [[], [], []]
    assert log.reads == [] and log.start_calls == 1


def test_a_skipped_first_record_is_read_back_before_the_event() -> None:
    log = FakeLog({("t", 6): 37})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    assert offsets_read(guard, "t", 6, 38) == [37]
    assert offsets_read(guard, "t", 6, 39) == []
    assert log.reads == [("t", 6, 37, 38)]


def test_a_gap_in_the_middle_is_read_back() -> None:
    log = FakeLog({("t", 0): 0})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    offsets_read(guard, "t", 0, 0)
    assert offsets_read(guard, "t", 0, 4) == [1, 2, 3]
    assert offsets_read(guard, "t", 0, 5) == []


def test_redelivered_records_are_not_a_gap_and_do_not_move_the_position_back() -> None:
    log = FakeLog({("t", 0): 10})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    for o in (10, 11, 12):
        offsets_read(guard, "t", 0, o)
    assert offsets_read(guard, "t", 0, 12) == []  # seen again (at-least-once)
    assert offsets_read(guard, "t", 0, 11) == []
    assert offsets_read(guard, "t", 0, 13) == []
    assert log.reads == []


def test_partitions_are_tracked_separately_and_reset_asks_again() -> None:
    log = FakeLog({("t", 0): 5, ("t", 1): 7, ("u", 0): 0})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    assert offsets_read(guard, "t", 0, 5) == []
    assert offsets_read(guard, "t", 1, 9) == [7, 8]
    assert offsets_read(guard, "u", 0, 0) == []
    guard.reset()  # a rebalance: the group's committed offsets are the truth again
    log.starts[("t", 0)] = 20
    assert offsets_read(guard, "t", 0, 21) == [20]
    assert log.start_calls == 2


def test_a_partition_kept_across_a_rebalance_keeps_its_position() -> None:
    log = FakeLog({("t", 0): 5, ("t", 1): 5})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    for o in range(5, 30):  # handled, but the group's commit is still at 5
        offsets_read(guard, "t", 0, o)
        offsets_read(guard, "t", 1, o)
    guard.reset({("t", 0)})  # t/0 stays here, t/1 went away and comes back later
    assert offsets_read(guard, "t", 0, 30) == []  # nothing read back a second time
    assert offsets_read(guard, "t", 1, 30) == list(range(5, 30))  # new here: from the commit
    assert offsets_read(guard, "t", 0, 32) == [31]  # gaps are still caught


def test_records_seen_here_are_known_until_the_partition_leaves() -> None:
    """Faust's recovery can deliver a kept partition again from its commit: what the agent
    saw here is known as seen, and only that."""
    log = FakeLog({("t", 0): 5, ("t", 1): 5})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    assert not guard.seen("t", 0, 5)  # nothing seen yet
    for o in range(5, 10):
        offsets_read(guard, "t", 0, o)
        offsets_read(guard, "t", 1, o)
    assert [o for o in range(3, 12) if guard.seen("t", 0, o)] == [3, 4, 5, 6, 7, 8, 9]
    guard.reset({("t", 0)})  # t/0 stays here: still seen; t/1 left: nothing known
    assert guard.seen("t", 0, 9) and not guard.seen("t", 0, 10)
    assert not guard.seen("t", 1, 5) and not guard.seen("u", 0, 0)
    guard.reset()  # an agent dropped what it held: nothing is taken for seen
    assert not guard.seen("t", 0, 5)


def test_an_unknown_start_checks_nothing() -> None:
    log = FakeLog({})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    assert offsets_read(guard, "t", 0, 50) == []
    assert offsets_read(guard, "t", 0, 52) == [51]  # later gaps are still caught


def test_records_left_at_the_end_of_a_partition_are_found_once_it_stays_quiet() -> None:
    log = FakeLog({("t", 0): 10, ("t", 1): 4})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    for o in range(10, 20):
        offsets_read(guard, "t", 0, o)  # t/0 delivered up to 19 of 25; t/1 never delivered
    now = time.monotonic()
    ends = {("t", 0): 25, ("t", 1): 9, ("t", 2): 0}
    assert asyncio.run(guard.stranded(ends, idle_s=5, now=now)) == {}  # not quiet long enough
    later = now + 6
    assert asyncio.run(guard.stranded(ends, idle_s=5, now=later)) == {("t", 0): 20, ("t", 1): 4}
    # after a seek the stream gets time to deliver before the next seek
    assert asyncio.run(guard.stranded(ends, idle_s=5, now=later + 1)) == {}
    offsets_read(guard, "t", 0, 24)  # it did: t/0 has been read to its end (gap read back)
    assert asyncio.run(guard.stranded(ends, idle_s=5, now=later + 20)) == {("t", 1): 4}


def test_a_partition_read_to_its_end_is_not_stranded() -> None:
    log = FakeLog({("t", 0): 3})
    guard = OffsetGuard(log.start_offsets, log.read_range)
    for o in (3, 4, 5):
        offsets_read(guard, "t", 0, o)
    later = time.monotonic() + 60
    assert asyncio.run(guard.stranded({("t", 0): 6}, idle_s=5, now=later)) == {}
