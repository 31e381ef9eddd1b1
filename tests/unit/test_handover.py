"""Handed-over positions: what a worker commits for partitions that move away.

The commits themselves go through a real Faust consumer in
tests/kafka/test_faust_fixes.py.
"""

from __future__ import annotations

from pipeline.scoring.faust_fixes.handover import Handled


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
