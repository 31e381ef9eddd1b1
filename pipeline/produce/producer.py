"""TurnProducer: input events into chat.turns, keyed by session_id (the SDK applications use)."""

from __future__ import annotations

import threading
import time
from typing import Any

from kafka.errors import KafkaError
from kafka.producer.future import RecordMetadata
from pydantic import ValidationError

from pipeline.broker.clients import producer
from pipeline.broker.topics_check import require_topics
from pipeline.errors import BrokerError, ConfigError
from pipeline.events import (
    DeadLetter,
    Message,
    SessionEnd,
    Turn,
    dead_letter,
    encode,
    input_event,
)
from pipeline.settings import KafkaSettings, Settings, load_settings
from pipeline.topics.spec import Topics

__all__ = ["TurnProducer", "dead_letter_bytes", "require_topics"]  # require_topics: for SDK users


class TurnProducer:
    """Idempotent, acks=all producer of input events.

    The key is the session_id, so a session's events stay ordered in one
    partition. Sends are buffered and retried while Kafka is away (up to two
    minutes); delivery failures are counted and raised by :meth:`flush`, which
    leaving a ``with`` block calls: none is dropped silently.
    """

    def __init__(
        self, settings: Settings, check_topics: bool = True, timeout_s: float = 15.0
    ) -> None:
        self.topics = settings.topics
        self.turns_topic = self.topics.chat_turns.name
        self.deadletter_topic = self.topics.deadletter.name
        if check_topics:
            require_topics(settings, [self.turns_topic, self.deadletter_topic], timeout_s)
        max_bytes = max(
            self.topics.chat_turns.max_message_bytes, self.topics.deadletter.max_message_bytes
        )
        self._producer = producer(settings, max_request_size=max_bytes)
        self._lock = threading.Lock()
        self.sent = 0
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None

    @classmethod
    def from_env(cls, timeout_s: float = 15.0) -> TurnProducer:
        """A producer set up by the environment: KAFKA_BOOTSTRAP_SERVERS (unset: the local
        broker), KAFKA_* security, TURNSTREAM_TOPIC_PREFIX, TURNSTREAM_CONFIG."""
        return cls(load_settings(), timeout_s=timeout_s)

    @classmethod
    def connect(
        cls, bootstrap_servers: str, timeout_s: float = 15.0, **settings: Any
    ) -> TurnProducer:
        """A producer for the cluster at ``host:port[,host:port...]``; other settings (KAFKA_*
        security, topic prefix) from the environment unless given, e.g. ``topic_prefix``."""
        try:
            kafka = KafkaSettings(bootstrap_servers=bootstrap_servers)
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
            raise ConfigError(problem) from exc
        return cls(load_settings(kafka=kafka, **settings), timeout_s=timeout_s)

    def send_turn(
        self,
        session_id: str,
        turn_index: int,
        messages: list[dict[str, Any]],
        response: str | dict[str, Any],
        turn_type: str = "main",
        ts: float | None = None,
        **fields: Any,
    ) -> Turn:
        """One policy turn: the chat ``messages`` it was prompted with and its ``response``
        (text, or ``{"content": ..., "tool_calls": [...]}``); other Turn fields by name."""
        answer = {"content": response} if isinstance(response, str) else response
        event = self._event(
            type="turn",
            session_id=session_id,
            turn_index=turn_index,
            turn_type=turn_type,
            messages=messages,
            response=answer,
            ts=ts,
            **fields,
        )
        assert isinstance(event, Turn)
        return event

    def send_message(
        self, session_id: str, role: str, content: Any, ts: float | None = None, **fields: Any
    ) -> Message:
        """The user's or a tool's message after a turn (``role`` user or tool): its next state."""
        event = self._event(
            type="message",
            session_id=session_id,
            message={"role": role, "content": content, **fields},
            ts=ts,
        )
        assert isinstance(event, Message)
        return event

    def end_session(self, session_id: str, ts: float | None = None) -> SessionEnd:
        """The session is over: its last turn is scored without a next state."""
        event = self._event(type="session_end", session_id=session_id, ts=ts)
        assert isinstance(event, SessionEnd)
        return event

    def _event(self, ts: float | None, **fields: Any) -> Turn | Message | SessionEnd:
        """Validate (EventDecodeError names the field) and send; ``ts`` defaults to now."""
        event = input_event({**fields, "ts": time.time() if ts is None else ts})
        self.send(event)
        return event

    def send(self, event: Turn | Message | SessionEnd) -> None:
        self.send_raw(event.session_id, encode(event))

    def send_raw(self, session_id: str, value: bytes) -> None:
        """Send an already validated, encoded input event."""
        self._send(self.turns_topic, session_id.encode(), value)

    def send_dead_letter(self, record: DeadLetter) -> None:
        self._send(self.deadletter_topic, None, encode(record))

    def dead_letter_raw(self, stage: str, error: str, source: str, raw: bytes) -> None:
        value = dead_letter_bytes(self.topics, stage, error, source, raw, time.time())
        self._send(self.deadletter_topic, None, value)

    def _send(self, topic: str, key: bytes | None, value: bytes) -> None:
        try:
            future = self._producer.send(topic, key=key, value=value)
        except KafkaError as exc:
            self._failed(exc)
            raise BrokerError(f"cannot send to {topic}: {exc}") from exc
        self.sent += 1
        future.add_callback(self._delivered)
        future.add_errback(self._failed)

    def _delivered(self, _metadata: RecordMetadata) -> None:
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

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Flush (raising BrokerError if an event was not delivered), then close."""
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()


def dead_letter_bytes(
    topics: Topics, stage: str, error: str, source: str, raw: bytes, ts: float
) -> bytes:
    """A dead letter for ``raw``, kept within the dead-letter topic's record size."""
    limit = topics.deadletter.max_message_bytes // 2  # room for base64 and fields
    return encode(dead_letter(stage, error, source, raw, ts, limit))
