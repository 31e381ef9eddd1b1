"""TurnProducer: input events into chat.turns, keyed by session_id."""

from __future__ import annotations

import threading
import time
from typing import Any

from kafka.errors import KafkaError

from pipeline.broker.clients import admin_client, producer
from pipeline.errors import BrokerError
from pipeline.events import DeadLetter, Message, SessionEnd, Turn, dead_letter, encode
from pipeline.settings import Settings


class TurnProducer:
    """Idempotent, acks=all producer of input events.

    The key is the session_id, so a session's events stay ordered in one
    partition. Delivery failures are counted and raised by :meth:`flush`; none
    is dropped silently.
    """

    def __init__(self, settings: Settings, check_topics: bool = True) -> None:
        self.topics = settings.topics
        self.turns_topic = self.topics.chat_turns.name
        self.deadletter_topic = self.topics.deadletter.name
        if check_topics:
            require_topics(settings, [self.turns_topic, self.deadletter_topic])
        max_bytes = max(
            self.topics.chat_turns.max_message_bytes, self.topics.deadletter.max_message_bytes
        )
        self._producer = producer(settings, max_request_size=max_bytes)
        self._lock = threading.Lock()
        self.sent = 0
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None

    def send(self, event: Turn | Message | SessionEnd) -> None:
        self.send_raw(event.session_id, encode(event))

    def send_raw(self, session_id: str, value: bytes) -> None:
        """Send an already validated, encoded input event."""
        self._send(self.turns_topic, session_id.encode(), value)

    def send_dead_letter(self, record: DeadLetter) -> None:
        self._send(self.deadletter_topic, None, encode(record))

    def dead_letter_raw(self, stage: str, error: str, source: str, raw: bytes) -> None:
        limit = self.topics.deadletter.max_message_bytes // 2  # room for base64 and fields
        self.send_dead_letter(dead_letter(stage, error, source, raw, time.time(), limit))

    def _send(self, topic: str, key: bytes | None, value: bytes) -> None:
        try:
            future = self._producer.send(topic, key=key, value=value)
        except KafkaError as exc:
            self._failed(exc)
            raise BrokerError(f"cannot send to {topic}: {exc}") from exc
        self.sent += 1
        future.add_callback(self._delivered)
        future.add_errback(self._failed)

    def _delivered(self, _metadata: Any) -> None:
        with self._lock:
            self.delivered += 1

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self.failed += 1
            if self.first_error is None:
                self.first_error = repr(exc)

    def flush(self, timeout_s: float = 120.0) -> None:
        """Wait for every send; raise BrokerError if any was not delivered."""
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise BrokerError(f"flush to Kafka timed out after {timeout_s:.0f}s: {exc}") from exc
        if self.failed:
            raise BrokerError(
                f"{self.failed} of {self.sent} events were not delivered; first error: "
                f"{self.first_error}"
            )

    def close(self) -> None:
        self._producer.close()

    def __enter__(self) -> TurnProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def require_topics(settings: Settings, names: list[str]) -> None:
    """Fail early, and say what to run, when the pipeline's topics do not exist."""
    admin = admin_client(settings)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    missing = [n for n in names if n not in existing]
    if missing:
        raise BrokerError(
            f"topic(s) {missing} do not exist on {settings.bootstrap_servers}; "
            "create them with `turnstream topics apply`"
        )
