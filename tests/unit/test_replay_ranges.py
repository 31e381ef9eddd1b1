"""Parsing of replay ranges: times, offsets, partitions, replay ids."""

from __future__ import annotations

import pytest

from pipeline.broker.reading import TopicRange
from pipeline.errors import ConfigError
from pipeline.replay.copy import replay_id_for
from pipeline.replay.ranges import parse_offsets, parse_partitions, parse_time


def test_times_in_iso_8601_or_epoch_ms() -> None:
    assert parse_time("1790000000000") == 1_790_000_000_000
    assert parse_time("2026-11-30T10:00:00Z") == 1_796_032_800_000
    assert parse_time("2026-11-30T10:00:00") == 1_796_032_800_000  # no zone: UTC
    assert parse_time("2026-11-30T11:00:00+01:00") == 1_796_032_800_000
    with pytest.raises(ConfigError, match="--since 'yesterday': expected ISO 8601"):
        parse_time("yesterday", "--since")


def test_offsets_and_partitions() -> None:
    assert parse_offsets("0:10,3:5", "--start-offsets") == {0: 10, 3: 5}
    assert parse_offsets(None, "--start-offsets") == {}
    with pytest.raises(ConfigError, match="PARTITION:OFFSET"):
        parse_offsets("0=10", "--end-offsets")
    assert parse_partitions("0,2") == {0, 2} and parse_partitions(None) is None
    with pytest.raises(ConfigError, match="comma-separated"):
        parse_partitions("all")


def test_replay_ids_follow_the_request() -> None:
    a = replay_id_for("t.chat.turns", "copy", since="1", until=None)
    assert a == replay_id_for("t.chat.turns", "copy", since="1")  # unset options do not count
    assert a != replay_id_for("t.chat.turns", "copy", since="2")
    assert a != replay_id_for("t.chat.turns", "other", since="1")
    assert len(a) == 16


def test_a_range_splits_into_shares_of_whole_partitions() -> None:
    span = TopicRange("t", {0: (0, 100), 1: (10, 60), 2: (5, 5), 3: (0, 40), 4: (7, 17)})
    shares = span.split(2)
    assert [sorted(s.spans) for s in shares] == [[0], [1, 3, 4]]  # 100 records, and 50+40+10
    assert all(s.spans[p] == span.spans[p] for s in shares for p in s.spans)  # whole partitions
    assert sum(s.total for s in shares) == span.total
    assert [s.spans for s in span.split(8)] == [{0: (0, 100)}, {1: (10, 60)}, {3: (0, 40)},
                                                {4: (7, 17)}]  # fmt: skip
    assert TopicRange("t", {0: (3, 3)}).split(2) == []  # nothing to read: no share
