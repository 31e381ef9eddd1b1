"""The range reader's arithmetic: which offsets to read, where a span is cut, when it is done."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from pipeline.broker.reading import (
    TopicRange,
    clamp,
    cut,
    describe_unfinished,
    span_by_time,
    to_read,
    unfinished,
)


def test_a_span_is_kept_within_the_log() -> None:
    firsts, ends = {0: 5, 1: 0, 2: 0}, {0: 20, 1: 10, 2: 0}
    assert clamp(firsts, ends) == {0: (5, 20), 1: (0, 10), 2: (0, 0)}
    # trimmed by retention: starts at the log start; past the end: ends there
    assert clamp(firsts, ends, {0: 2, 1: 3}, {0: 50, 1: 8}) == {0: (5, 20), 1: (3, 8), 2: (0, 0)}
    # a stop before the start is an empty span at the start, never a negative one
    assert clamp(firsts, ends, {1: 7}, {1: 4}) == {0: (5, 20), 1: (7, 7), 2: (0, 0)}


def test_only_partitions_with_something_to_read_are_read() -> None:
    span = TopicRange("t", {2: (4, 9), 0: (3, 3), 1: (0, 1)})
    assert to_read(span) == {TopicPartition("t", 1): (0, 1), TopicPartition("t", 2): (4, 9)}
    assert to_read(TopicRange("t", {0: (0, 0)})) == {}


def test_a_fetch_is_cut_at_the_end_of_the_span() -> None:
    records = [SimpleNamespace(offset=o) for o in (3, 4, 6, 7)]
    assert cut(records, 8) is records
    assert [r.offset for r in cut(records, 6)] == [3, 4]
    assert cut(records, 3) == [] and cut([], 5) == []


def test_a_partition_is_done_when_its_position_reaches_its_end() -> None:
    a, b, c = (TopicPartition("t", p) for p in (0, 1, 2))
    ends = {a: 10, b: 5, c: 0}
    # a position past the end (offsets without records: compacted, a transaction marker) is done
    assert unfinished({a: 9, b: 6}, ends) == [a]
    assert unfinished({}, ends) == [a, b]
    assert unfinished({a: 10, b: 5}, ends) == []
    assert describe_unfinished({a: 9}, ends) == "partition 0 at 9 of 10, partition 1 at 0 of 5"


class FakeOffsets:
    """Offsets of a two-partition log: partition 0 holds 10..20, partition 1 holds 0..4;
    record n's timestamp is 1000 * n."""

    def __init__(self) -> None:
        self.firsts = {0: 10, 1: 0}
        self.ends = {0: 20, 1: 4}

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.firsts[tp.partition] for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends[tp.partition] for tp in tps}

    async def offsets_for_times(self, stamps: dict[TopicPartition, int]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for tp, ms in stamps.items():
            n = max(self.firsts[tp.partition], -(-ms // 1000))
            out[tp] = SimpleNamespace(offset=n) if n < self.ends[tp.partition] else None
        return out


def test_a_range_by_time_starts_and_stops_at_the_first_record_at_or_after_each_time() -> None:
    offsets = FakeOffsets()
    whole = asyncio.run(span_by_time(offsets, "t", [0, 1]))
    assert whole.spans == {0: (10, 20), 1: (0, 4)}
    timed = asyncio.run(span_by_time(offsets, "t", [1, 0], since_ms=2500, until_ms=15000))
    # partition 0: from 10 (nothing before the log start) to before 15; partition 1: 3 to end
    assert timed.spans == {0: (10, 15), 1: (3, 4)}
    late = asyncio.run(span_by_time(offsets, "t", [0], since_ms=99_000))
    assert late.spans == {0: (20, 20)} and late.total == 0
