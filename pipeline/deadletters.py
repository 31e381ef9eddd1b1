"""Dead letters: what could not be handled goes to ``pipeline.deadletter`` with the reason.

Every stage (pairing, judging, retry, the trainer, the proxy) builds its dead
letters here, so each says what was wrong, why, and where it came from, and
each is counted in ``turnstream_dead_letters_total{stage}``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import Counter

from pipeline.events import dead_letter, encode
from pipeline.topics import Topics

DEAD_LETTERS = Counter(
    "turnstream_dead_letters_total", "records sent to the dead-letter topic", ["stage"]
)


@dataclass(frozen=True)
class Out:
    """One record to send: topic, key and value (and partition; None: by key)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None


class DeadLetters:
    """Builds dead-letter records that say what, why and where."""

    def __init__(self, topics: Topics) -> None:
        self.topic = topics.deadletter.name
        self.max_raw = topics.deadletter.max_message_bytes // 2
        # what the broker would refuse: above max.message.bytes, less room for the batch
        self.limits = {spec.name: spec.max_message_bytes - 1024 for spec in topics}

    def __call__(self, stage: str, error: str, source: str, raw: bytes | None) -> Out:
        return Out(self.topic, None, self.encoded(stage, error, source, raw))

    def encoded(self, stage: str, error: str, source: str, raw: bytes | None) -> bytes:
        """The value of a dead letter for ``self.topic`` (counted as sent)."""
        DEAD_LETTERS.labels(stage).inc()
        return encode(dead_letter(stage, error, source, raw, time.time(), self.max_raw))

    def unless_fits(self, stage: str, out: Out, what: str, source: str) -> Out:
        """``out``, or a dead letter saying why when it is too large for its topic.

        Kept here rather than sent: the broker would refuse it, a refused send stops
        the worker, and the same record would stop the next one.
        """
        limit, size = self.limits[out.topic], len(out.value or b"")
        if size <= limit:
            return out
        error = (
            f"{what} is {size:,} bytes, above {out.topic} max.message.bytes less 1 KiB ({limit:,})"
        )
        return self(stage, error, source, out.value)
