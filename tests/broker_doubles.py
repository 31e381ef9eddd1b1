"""Stand-ins for the trainer's Kafka clients: a consumer whose commits fail while the
broker is down, a producer whose sends complete (or expire) at flush."""

from __future__ import annotations

from kafka.errors import KafkaTimeoutError
from kafka.future import Future


class FlakyConsumer:
    """Refuses ``failures`` commits the way kafka-python does while the broker is down."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.committed: list[dict] = []

    def commit(self, offsets: dict, timeout_ms: int | None = None) -> None:
        from kafka.errors import KafkaConnectionError

        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("111 ECONNREFUSED")
        self.committed.append(offsets)


class OutageProducer:
    """Completes futures at flush: the first ``failures`` the way kafka-python expires
    a batch after delivery_timeout_ms while the broker is down, the rest delivered."""

    def __init__(self, failures: int = 0, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or KafkaTimeoutError("Expiring 1 record(s): 120000 ms has passed")
        self.sends = 0
        self.delivered: list[tuple[str, bytes | None, bytes]] = []
        self._in_flight: list[tuple[Future, tuple[str, bytes | None, bytes]]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes = b"") -> Future:
        self.sends += 1
        future = Future()
        self._in_flight.append((future, (topic, key, value)))
        return future

    def flush(self, timeout: float | None = None) -> None:
        for future, record in self._in_flight:
            if self.failures:
                self.failures -= 1
                future.failure(self.error)
            else:
                self.delivered.append(record)
                future.success(None)
        self._in_flight = []
