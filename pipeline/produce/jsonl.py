"""`turnstream produce FILE.jsonl`: validate a file of input events and send it.

Every line is checked (JSON, schema, size) before anything is sent; the lines
then go out unchanged, keyed by session_id, through the bulk producer
(:mod:`pipeline.broker.bulk`), partitioned as :class:`TurnProducer` would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from pipeline.broker.bulk import BatchSender, batch_sender
from pipeline.broker.topics_check import require_topics
from pipeline.errors import EventDecodeError, TurnstreamError
from pipeline.events import Message, SessionEnd, Turn, decode_input
from pipeline.produce.producer import dead_letter_bytes
from pipeline.settings import Settings

Progress = Callable[[int], None]  # called with the bytes read since the last call


@dataclass(frozen=True)
class LineError:
    line: int
    error: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.error}"


@dataclass
class ProduceReport:
    valid: int = 0
    sent: int = 0
    dead_lettered: int = 0
    errors: list[LineError] = field(default_factory=list)


def iter_lines(path: Path, progress: Progress | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, bytes without the line end) of each non-blank line."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if progress:
                progress(len(raw))
            line = raw.rstrip(b"\r\n")
            if line.strip():
                yield number, line


def check_line(raw: bytes, max_bytes: int) -> Turn | Message | SessionEnd:
    if len(raw) > max_bytes:
        raise EventDecodeError(
            "", f"event is {len(raw):,} bytes, above the topic's max.message.bytes {max_bytes:,}"
        )
    return decode_input(raw)


def _session_id(raw: bytes) -> str:
    try:
        value = orjson.loads(raw)["session_id"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise EventDecodeError("", f"changed since it was validated: {exc}") from exc
    if not isinstance(value, str):
        raise EventDecodeError("session_id", "changed since it was validated")
    return value


def validate_file(path: Path, max_bytes: int, progress: Progress | None = None) -> ProduceReport:
    """Check every line; nothing is sent."""
    report = ProduceReport()
    for number, raw in iter_lines(path, progress):
        try:
            check_line(raw, max_bytes)
            report.valid += 1
        except EventDecodeError as exc:
            report.errors.append(LineError(number, str(exc)))
    return report


def produce_file(
    path: Path,
    settings: Settings,
    skip_invalid: bool,
    progress: Progress | None = None,
    validated: bool = False,
) -> ProduceReport:
    """Send the valid lines of ``path`` as they are (validated, not rewritten).

    Without ``skip_invalid`` the caller runs :func:`validate_file` first, sends
    nothing when any line is bad, and passes ``validated=True`` so that lines
    are only parsed for their key here; with ``skip_invalid``, bad lines go to
    the dead-letter topic with their reason and ``file:line``.
    """
    topics = settings.topics
    require_topics(settings, [topics.chat_turns.name, topics.deadletter.name])
    return asyncio.run(_produce(path, settings, skip_invalid, progress, validated))


async def _produce(
    path: Path,
    settings: Settings,
    skip_invalid: bool,
    progress: Progress | None,
    validated: bool,
) -> ProduceReport:
    turns, dead = settings.topics.chat_turns, settings.topics.deadletter
    report = ProduceReport()
    largest = max(turns.max_message_bytes, dead.max_message_bytes)
    async with batch_sender(settings, f"events from {path}", largest) as out:
        for number, raw in iter_lines(path, progress):
            try:
                if validated:
                    session_id = _session_id(raw)
                else:
                    session_id = check_line(raw, turns.max_message_bytes).session_id
            except EventDecodeError as exc:
                if validated:  # the file changed since it was validated
                    raise TurnstreamError(
                        f"{path} changed while being sent (line {number}: {exc}); "
                        f"{report.sent} event(s) before it had been sent"
                    ) from exc
                report.errors.append(LineError(number, str(exc)))
                if not skip_invalid:
                    raise
                await _dead_letter(out, settings, str(exc), f"{path}:{number}", raw)
                report.dead_lettered += 1
                continue
            key = session_id.encode()
            await out.add_keyed(turns.name, key, raw)
            report.valid += 1
            report.sent += 1
    return report


async def _dead_letter(
    out: BatchSender, settings: Settings, error: str, source: str, raw: bytes
) -> None:
    topic = settings.topics.deadletter.name
    value = dead_letter_bytes(settings.topics, "produce", error, source, raw, time.time())
    await out.add_keyed(topic, None, value)
