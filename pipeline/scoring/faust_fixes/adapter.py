"""The one place that touches faust-streaming's private consumer attributes.

Committing chosen offsets is not in Faust's public API: its consumer commits
only what its own ack tracking allows (see ``handover``). This module commits
through ``Consumer._commit`` and reads and records ``_committed_offset``, the
attributes of faust-streaming 0.15 (``faust/transport/consumer.py``). It
checks the installed versions on import: an untested version is a clear error
here rather than a silent mis-commit later. Tested against real consumers in
``tests/kafka/test_faust_fixes.py``.

Can go when faust-streaming offers a public commit of explicit offsets.
"""

from __future__ import annotations

from typing import Any

from pipeline.versions import require_tested

TESTED = {"faust-streaming": ("0.15.",), "aiokafka": ("0.12.", "0.13.", "0.14.")}


def check_versions() -> dict[str, str]:
    """The installed versions; ConfigError when one was never tested with these repairs."""
    return require_tested(
        TESTED,
        "the scoring worker's Faust repairs (pipeline/scoring/faust_fixes)",
        "tests/kafka/test_faust_fixes.py",
    )


VERSIONS = check_versions()


def committed_offset(consumer: Any, tp: Any) -> int:
    """The offset Faust last committed for ``tp`` (0 when none)."""
    return consumer._committed_offset.get(tp) or 0


async def commit(consumer: Any, offsets: dict[Any, int]) -> None:
    """Commit ``offsets`` (faust TP -> next offset) for the group, and tell Faust it did."""
    await consumer._commit(offsets)
    consumer._committed_offset.update(offsets)
