"""The proxy's spool: events Kafka could not take yet, kept on disk until it can.

One JSON Lines file per topic, ``<topic>.jsonl`` (the format `turnstream produce`
reads), appended whole lines at a time. Draining sends the lines in order and
records how far it got in ``<topic>.jsonl.sent`` after each acknowledged chunk,
so a proxy stopped mid-drain resumes where it was (a chunk may be sent twice,
never lost); a fully sent file is removed. Keys are the events' ``session_id``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import orjson

log = logging.getLogger(__name__)
Record = tuple[str, bytes | None, bytes]  # topic, key, value
CHUNK = 500


def key_of(value: bytes) -> bytes | None:
    """The Kafka key of a spooled event: its session_id, if it has one."""
    try:
        session = orjson.loads(value).get("session_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return session.encode() if isinstance(session, str) else None


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.lock = threading.RLock()  # appends, and the drain's last look, hold it

    def path(self, topic: str) -> Path:
        return self.directory / f"{topic}.jsonl"

    def append(self, topic: str, value: bytes) -> Path:
        with self.lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.path(topic)
            with open(path, "ab") as out:
                out.write(value.rstrip(b"\n") + b"\n")
            return path

    def pending(self, topics: list[str]) -> int:
        """Lines not yet sent, over ``topics``."""
        with self.lock:
            return sum(self._lines_after(t, self._sent(t)) for t in topics)

    def drain(
        self, topics: list[str], send: Callable[[list[Record]], None], then: Callable[[], None]
    ) -> int:
        """Send every pending line of ``topics`` in order with ``send`` (which raises if any
        was not delivered); once nothing is left, call ``then`` while appends wait."""
        sent = 0
        while True:
            with self.lock:
                work = [(t, self._sent(t)) for t in topics if self._lines_after(t, self._sent(t))]
                if not work:
                    for topic in topics:
                        self._forget(topic)
                    then()
                    return sent
            for topic, offset in work:
                sent += self._drain_file(topic, offset, send)

    def _drain_file(self, topic: str, offset: int, send: Callable[[list[Record]], None]) -> int:
        path = self.path(topic)
        sent = 0
        with open(path, "rb") as spooled:
            spooled.seek(offset)
            while True:
                lines = [line for line in (spooled.readline() for _ in range(CHUNK)) if line]
                whole = [line for line in lines if line.endswith(b"\n")]
                if not whole:
                    return sent
                send([(topic, key_of(line), line.rstrip(b"\n")) for line in whole])
                offset += sum(len(line) for line in whole)
                self._mark(topic, offset)
                sent += len(whole)
                if len(whole) < len(lines):
                    return sent  # a line still being written: take it next round

    def _sent(self, topic: str) -> int:
        try:
            return int((self.directory / f"{topic}.jsonl.sent").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def _mark(self, topic: str, offset: int) -> None:
        marker = self.directory / f"{topic}.jsonl.sent"
        partial = marker.with_suffix(".tmp")
        partial.write_text(str(offset))
        partial.replace(marker)

    def _lines_after(self, topic: str, offset: int) -> int:
        try:
            with open(self.path(topic), "rb") as spooled:
                spooled.seek(offset)
                return sum(1 for _ in spooled)
        except OSError:
            return 0

    def _forget(self, topic: str) -> None:
        for path in (self.path(topic), self.directory / f"{topic}.jsonl.sent"):
            path.unlink(missing_ok=True)
