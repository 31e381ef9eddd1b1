"""Fetched records as aiokafka parsed them, without a ConsumerRecord built for each.

aiokafka's fetcher parses a record batch in C, then builds a Python
``ConsumerRecord`` dataclass per record (eleven fields, the key's and value's
sizes, a copy of the headers): a quarter to a third of a range read's CPU
(100,000 records: 0.61-0.77 s with them, 0.46-0.50 s without). A consumer made
with ``key_deserializer=RAW`` gets the parsed records themselves: ``offset``,
``timestamp``, ``timestamp_type``, ``key``, ``value``, ``headers`` (a list of
``(str, bytes)``) and ``checksum``, but no ``topic`` or ``partition``: they
are the keys of what ``getmany`` returns. Every other consumer in the process
is untouched. Only the bulk paths' range reader asks for it
(:func:`pipeline.broker.bulk.range_consumer`).

This replaces ``aiokafka.consumer.fetcher.PartitionRecords`` (the class the
fetcher builds for each fetched partition) with a subclass that differs only
for such consumers, after checking that the installed aiokafka is a tested
version. Tested by tests/kafka/test_bulk_reads.py (the records a raw reader
yields against a plain one's, transactions aborted and committed) and
tests/unit/test_raw_records.py (each test's install undone after it,
tests/conftest.py). Can go when aiokafka yields parsed records
without a per-record dataclass (it has no option for it as of 0.14).
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError
from pipeline.library_versions import require_tested

TESTED: dict[str, tuple[str, ...]] = {"aiokafka": ("0.12.", "0.13.", "0.14.")}


def RAW(key: bytes | None) -> bytes | None:
    """The ``key_deserializer`` of a consumer whose fetched records are not rebuilt."""
    return key


# aiokafka's own PartitionRecords while ours is in its place (None: not installed). Read and
# written by install() and uninstall() only, called where a raw consumer is made (an event
# loop's thread; the tests' fixture between tests): never two at once, so no lock.
_replaced: type | None = None


def installed() -> bool:
    return _replaced is not None


def install() -> None:
    """Make consumers with ``key_deserializer=RAW`` yield parsed records (once a process)."""
    global _replaced
    if _replaced is not None:
        return
    require_tested(
        TESTED, "the raw record reader (pipeline/broker/raw_records.py)", "test_bulk_reads.py"
    )
    from aiokafka.consumer import fetcher

    base = fetcher.PartitionRecords
    if not callable(getattr(base, "_consumer_record", None)):
        raise ConfigError(
            "aiokafka's PartitionRecords has no _consumer_record to bypass: "
            "extend pipeline/broker/raw_records.py"
        )

    class PartitionRecords(base):  # type: ignore[misc, valid-type]
        def _consumer_record(self, tp: Any, record: Any) -> Any:
            if self._key_deserializer is RAW:
                return record
            return super()._consumer_record(tp, record)

    fetcher.PartitionRecords = PartitionRecords
    _replaced = base


def uninstall() -> None:
    """Put aiokafka's own PartitionRecords back: the tests undo :func:`install` after each
    test that made it, so no other test runs with it."""
    global _replaced
    if _replaced is None:
        return
    from aiokafka.consumer import fetcher

    fetcher.PartitionRecords = _replaced
    _replaced = None
