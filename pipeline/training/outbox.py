"""What the trainer produces (dead letters, policy versions) until it is delivered.

The trainer commits offsets only after the records it produced for them are on
the broker. A broker outage longer than the producer's delivery timeout fails
their futures; the outbox keeps each record's bytes so it can send it again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from pipeline.backoff import RetryPolicy, retry
from pipeline.errors import BrokerError

log = logging.getLogger(__name__)


@dataclass
class Outgoing:
    topic: str
    key: bytes | None
    value: bytes
    future: Any = None  # None: not with the producer (never handed over, or failed)


class Outbox:
    """Records sent since the last delivery check, kept until the broker has them."""

    def __init__(self, retry_policy: RetryPolicy, flush_wait_s: float = 5.0) -> None:
        self.records: list[Outgoing] = []
        self.retry_policy = retry_policy  # how long to wait before sending failed records again
        self.flush_wait_s = flush_wait_s  # how often a wait for the broker looks for a stop

    def send(self, out: KafkaProducer, topic: str, value: bytes, key: bytes | None = None) -> None:
        record = Outgoing(topic, key, value)
        self.records.append(record)
        _hand_over(out, record)

    def deliver(self, out: KafkaProducer, stop: Callable[[], bool]) -> bool:
        """Wait until every record is delivered, waiting out a broker outage.

        Records the producer gave up on are sent again, so one whose ack was
        lost in the outage can arrive twice: delivery is at-least-once. Returns
        False, with records still undelivered, once ``stop()`` is true; the
        caller must then not commit past them (they are produced again when the
        records that caused them are read again after the restart). A
        non-retriable failure (a record too large, no access) raises BrokerError.
        """
        try:
            return retry(
                lambda _attempt: self._until_failure(out, stop),
                self.retry_policy,
                (KafkaError,),
                on_retry=self._log_retry,
                stop=stop,
            )
        except KafkaError:
            if not stop():
                raise
            log.warning("stopping with %d records undelivered", len(self.records))
            return False

    def _until_failure(self, out: KafkaProducer, stop: Callable[[], bool]) -> bool:
        """Hand over what the producer does not hold and wait: True once all is delivered,
        False at a stop; a delivery that failed (retriably) raises its error."""
        while True:
            for record in self.records:
                if record.future is None:
                    _hand_over(out, record)
            with contextlib.suppress(KafkaTimeoutError):  # still under way: look for a stop
                out.flush(timeout=self.flush_wait_s)
            failure = self._settle()
            if not self.records:
                return True
            if stop():
                log.warning("stopping with %d records undelivered", len(self.records))
                return False
            if failure is not None:
                raise failure

    def _log_retry(self, _attempt: int, error: BaseException, delay_s: float) -> None:
        log.warning(
            "%d records undelivered (%r); sending again in %.1fs", len(self.records), error, delay_s
        )

    def _settle(self) -> BaseException | None:
        """Drop delivered records, mark retriably failed ones to send again."""
        failure: BaseException | None = None
        undelivered = []
        for record in self.records:
            future = record.future
            if future is not None and future.succeeded():
                continue
            if future is not None and future.failed():
                exc = future.exception
                if not (isinstance(exc, KafkaError) and exc.retriable):
                    raise BrokerError(
                        f"a record for {record.topic} could not be delivered: {exc!r}"
                    ) from exc
                record.future, failure = None, exc
            elif future is None:
                failure = failure or KafkaTimeoutError("not handed to the producer")
            undelivered.append(record)
        self.records = undelivered
        return failure


def _hand_over(out: KafkaProducer, record: Outgoing) -> None:
    """Give ``record`` to the producer; while the broker is down that can fail too."""
    try:
        record.future = out.send(record.topic, key=record.key, value=record.value)
    except KafkaError as exc:
        if not exc.retriable:
            raise BrokerError(f"a record for {record.topic} could not be sent: {exc!r}") from exc
        log.warning("sending a record to %s failed (%r); will retry", record.topic, exc)
        record.future = None
