"""The one place that touches faust-streaming's private consumer attributes.

Committing chosen offsets is not in Faust's public API: its consumer commits
only what its own ack tracking allows (see ``handover``). This module commits
through ``Consumer._commit`` and reads and records ``_committed_offset``, the
attributes of faust-streaming 0.15 (``faust/transport/consumer.py``); it also
hands out the aiokafka producer inside Faust's (``Producer._ensure_producer``). It
checks the installed versions on import: an untested version is a clear error
here rather than a silent mis-commit later. Tested against real consumers in
``tests/kafka/test_faust_fixes.py``.

Can go when faust-streaming offers a public commit of explicit offsets.
"""

from __future__ import annotations

from typing import Any

from pipeline.versions import require_tested

TESTED = {
    "faust-streaming": ("0.15.",),
    "mode-streaming": ("0.7.",),  # drain: Service.wait_first, should_stop
    "aiokafka": ("0.12.", "0.13.", "0.14."),
}


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


async def seek(consumer: Any, tp: Any, offset: int) -> None:
    """Faust's ``Consumer.seek``, with aiokafka's seek run on the consumer's own thread.

    Works around: faust-streaming's threaded consumer (``ThreadDelegateConsumer._seek``)
    calls aiokafka's ``seek`` from the app's thread while aiokafka's fetcher runs on the
    consumer thread; a seek landing while the fetcher hands out records crashes it
    (``KeyError`` in ``Fetcher.fetched_records``), and the worker then reads nothing
    more without exiting. Seen here in a benchmark run on a loaded machine.
    """
    from aiokafka.errors import IllegalStateError

    thread = consumer._thread
    try:
        await thread.call_thread(thread.seek, tp, offset)
    except IllegalStateError:  # revoked while the seek waited its turn: its new owner reads it
        return
    consumer._read_offset[tp] = offset if offset else None  # as Faust's seek does


def kafka_producer(app: Any) -> Any:
    """The aiokafka producer inside Faust's (``Producer._ensure_producer``): Faust's ``send``
    takes one record at a time, the worker sends whole record batches."""
    return app.producer._ensure_producer()


def fetcher_crash(app: Any) -> BaseException | None:
    """Why the app's fetcher (the service that drains fetched records) crashed, if it did:
    Faust logs the crash and keeps the worker up, reading nothing."""
    fetcher = app._fetcher
    return fetcher.crash_reason if fetcher.crashed else None
