"""EventSink: the proxy's bounded, never-blocking path from a served request to Kafka.

A request handler only ever calls :meth:`EventSink.offer`, which returns at
once. A background thread hands queued events to an idempotent kafka-python
producer; a failed delivery is retried (``send_attempts`` in all) after the
retry policy's wait, on a timer, so no thread sleeps. An event that cannot be
queued (the buffer is full) or delivered is appended to the
:class:`~pipeline.proxy.spool.Spool`; both are counted, logged and shown on
``/healthz``.

While Kafka is away the sink is *diverted*: events go straight to the spool
(and a failed delivery calls ``on_trouble``, so the proxy's
:class:`~pipeline.proxy.link.KafkaLink` can divert it). The link drains the
spool once Kafka is back and then *resumes* the sink with its producer.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from pipeline.backoff import RetryPolicy
from pipeline.proxy import metrics
from pipeline.proxy.spool import Spool

log = logging.getLogger(__name__)


@dataclass
class Pending:
    topic: str
    key: bytes | None
    value: bytes
    attempts: int = 0
    seq: int = 0  # the order it was offered in (a retry goes back in that order)


class EventSink:
    def __init__(
        self,
        producer: KafkaProducer | None,
        capacity: int,
        retry_policy: RetryPolicy,
        spool_dir: Path,
        on_trouble: Callable[[str], None] | None = None,
    ) -> None:
        self._producer = producer  # None: wait for resume() (events queue meanwhile)
        self.capacity = capacity
        self.retry_policy = retry_policy  # its max_attempts: deliveries tried before spooling
        self.spool_dir = spool_dir
        self.spool = Spool(spool_dir)
        self.on_trouble = on_trouble
        self.diverted = False  # changed only under spool.lock
        self._queue: collections.deque[Pending] = collections.deque()
        self._cv = threading.Condition()
        self._in_flight = 0
        self._closing = False
        self._held: dict[int, tuple[Pending, threading.Timer]] = {}  # retries waiting
        self._thread: threading.Thread | None = None
        self._offered = itertools.count()
        self.delivered = 0
        self.retried = 0
        self.spooled = 0
        self.buffer_full = 0
        self.last_error: str | None = None

    # -- the request side ---------------------------------------------------

    def offer(self, topic: str, key: bytes | None, value: bytes) -> bool:
        """Queue an event for Kafka; never blocks. False when it went to the spool."""
        if self.diverted:
            with self.spool.lock:
                if self.diverted:  # still: resume() holds the same lock
                    self._spool(Pending(topic, key, value), "Kafka is unreachable")
                    return False
        with self._cv:
            if self._closing or len(self._queue) + self._in_flight >= self.capacity:
                self.buffer_full += 1
                metrics.SINK.labels("buffer_full").inc()
                full = not self._closing
            else:
                self._queue.append(Pending(topic, key, value, seq=next(self._offered)))
                metrics.BUFFERED.set(len(self._queue) + self._in_flight)
                self._cv.notify()
                return True
        reason = "buffer full" if full else "proxy shutting down"
        self._spool(Pending(topic, key, value), reason)
        return False

    @property
    def depth(self) -> int:
        with self._cv:
            return len(self._queue) + self._in_flight

    def stats(self) -> dict[str, Any]:
        return {
            "buffered": self.depth,
            "capacity": self.capacity,
            "delivered": self.delivered,
            "retried": self.retried,
            "buffer_full": self.buffer_full,
            "spooled": self.spooled,
            "spool_dir": str(self.spool_dir),
            "last_error": self.last_error,
        }

    # -- the Kafka side -----------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="turnstream-sink", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cv:
                # While a retry waits, nothing newer is sent: a session's events stay in order.
                while (
                    not self._queue or self._held or self._producer is None
                ) and not self._closing:
                    self._cv.wait()
                if not self._queue or self._producer is None:
                    return
                item = self._queue.popleft()
                self._in_flight += 1
                producer = self._producer
            self._send(producer, item)

    def _send(self, producer: KafkaProducer, item: Pending) -> None:
        item.attempts += 1
        try:
            future = producer.send(item.topic, key=item.key, value=item.value)
        except Exception as exc:  # KafkaError: broker unreachable; anything else: keep the event
            self._failed(item, exc)
            return
        future.add_callback(lambda _meta: self._delivered())
        future.add_errback(lambda exc: self._failed(item, exc))

    def _delivered(self) -> None:
        with self._cv:
            self._in_flight -= 1
            self.delivered += 1
            metrics.BUFFERED.set(len(self._queue) + self._in_flight)
            self._cv.notify_all()
        metrics.SINK.labels("delivered").inc()

    def _failed(self, item: Pending, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        retry = (
            not self.retry_policy.exhausted(item.attempts)
            and not self._closing
            and isinstance(exc, KafkaError)  # a bad event would fail again: spool it now
        )
        with self._cv:
            self._in_flight -= 1
            if retry:
                self.retried += 1
                self._in_flight += 1  # still ours until the retry lands
            self._cv.notify_all()
        if retry:
            metrics.SINK.labels("retried").inc()
            log.warning(
                "Kafka delivery to %s failed (attempt %d of %d): %s; retrying",
                item.topic,
                item.attempts,
                self.retry_policy.max_attempts,
                self.last_error,
            )
            delay = self.retry_policy.delay(item.attempts)
            timer = threading.Timer(delay, self._resend, (item,))
            timer.daemon = True
            with self._cv:
                self._held[id(item)] = (item, timer)
            timer.start()
        else:
            self._spool(item, f"not delivered after {item.attempts} attempt(s): {self.last_error}")
            if isinstance(exc, KafkaError) and self.on_trouble is not None:
                self.on_trouble(self.last_error)

    def _resend(self, item: Pending) -> None:
        with self._cv:
            if self._held.pop(id(item), None) is None:
                return  # close() took it over
            self._in_flight -= 1
            if self._closing:
                closing = True
            else:
                closing = False
                self._requeue(item)
                self._cv.notify()
        if closing:
            self._spool(item, "proxy shutting down before a retry")

    def _requeue(self, item: Pending) -> None:
        """Put a retried event back before every event offered after it (call under the
        lock). Events that failed together come back in the order they were offered, not
        in the order their retries fell due: a session's turns stay in order."""
        at = bisect.bisect_left(self._queue, item.seq, key=lambda queued: queued.seq)
        self._queue.insert(at, item)

    def _spool(self, item: Pending, reason: str) -> None:
        with self.spool.lock:  # one writer at a time, whole lines
            path = self.spool.append(item.topic, item.value)
            self.spooled += 1
        metrics.SINK.labels("spooled").inc()
        if self.diverted:  # the link says so, loudly and once in a while
            log.debug("event for %s spooled to %s (%s)", item.topic, path, reason)
            return
        log.error(
            "event for %s spooled to %s (%s); it is sent when Kafka takes events again "
            "(or send it with `turnstream produce %s`)",
            item.topic,
            path,
            reason,
            path,
        )

    def divert(self) -> int:
        """Send nothing more to Kafka: what is queued, and what comes, goes to the spool."""
        with self.spool.lock:
            self.diverted = True
            with self._cv:
                left = list(self._queue)
                self._queue.clear()
                metrics.BUFFERED.set(self._in_flight)
            for item in left:
                self._spool(item, "Kafka is unreachable")
        return len(left)

    def resume(self, producer: KafkaProducer) -> None:
        """Deliver to Kafka again with ``producer`` (called while spool appends wait)."""
        with self._cv:
            self._producer = producer
            self.diverted = False
            self._cv.notify_all()

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Deliver what is queued (within ``timeout_s``); spool whatever is left."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while (
                (self._queue or self._in_flight)
                and self._producer is not None
                and time.monotonic() < deadline
            ):
                self._cv.wait(timeout=0.1)
            self._closing = True
            left = list(self._queue)
            self._queue.clear()
            for item, timer in self._held.values():  # retries not yet due: spool them now
                timer.cancel()
                left.append(item)
                self._in_flight -= 1
            self._held.clear()
            self._cv.notify_all()
        try:
            if self._producer is not None:
                self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        except KafkaError as exc:
            log.error("final flush to Kafka failed: %s", exc)
        for item in sorted(left, key=lambda p: p.seq):  # retries first: offered earlier
            self._spool(item, "proxy shutting down")
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._producer is not None:
            self._producer.close(timeout=5)
        return self.stats()
