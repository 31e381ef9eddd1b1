"""KafkaLink: the proxy serves whether Kafka answers or not; this thread connects it when it does.

Until Kafka answers (and has the proxy's topics), captured events go to the
spool; the first failed attempt, and every later outage, is logged as an error
and shown on ``/healthz``. When Kafka answers, the spool is sent in order and the
sink delivers live again. A bootstrap address that cannot be right (no port, a
port that is not a number) stops the proxy at start instead.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from pipeline.backoff import RetryPolicy, retry
from pipeline.broker.clients import admin_client, producer
from pipeline.errors import BrokerError, ConfigError
from pipeline.proxy.sink import EventSink
from pipeline.proxy.spool import Record
from pipeline.settings import Settings

log = logging.getLogger(__name__)
UNREACHABLE = (BrokerError, KafkaError, OSError)  # Kafka did not answer, or not as needed


def bootstrap_addresses(servers: str) -> list[tuple[str, int]]:
    """``host:port[,host:port]`` as pairs; a ConfigError says what is wrong with the syntax."""
    pairs = []
    for entry in (e.strip() for e in servers.split(",")):
        host, sep, port = entry.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"Kafka bootstrap address {entry!r} (in {servers!r}) is not host:port with a port "
                "1..65535; fix KAFKA_BOOTSTRAP_SERVERS (host:port[,host:port])"
            )
        pairs.append((host, int(port)))
    return pairs


class KafkaLink:
    def __init__(
        self,
        settings: Settings,
        sink: EventSink,
        topics: list[str],
        on_up: Callable[[], None] | None = None,
        connect_timeout_s: float = 5.0,
        report_every_s: float = 60.0,
    ) -> None:
        self.settings = settings
        self.sink = sink
        self.topics = topics
        self.on_up = on_up
        self.connect_timeout_s = connect_timeout_s
        self.report_every_s = report_every_s
        self.retry_policy = RetryPolicy(None, 1.0, settings.proxy.reconnect_max_s)
        self.addresses = bootstrap_addresses(settings.bootstrap_servers)
        self.state = "connecting"  # connecting | up | unreachable
        self.problem: str | None = None
        self.down_since: float | None = None
        self.outages = 0
        self.drained = 0
        self._producer: KafkaProducer | None = None
        self._trouble = threading.Event()
        self._stop = threading.Event()
        self._reported = 0.0
        self._ever_up = False
        self._thread = threading.Thread(target=self._run, name="kafka-link", daemon=True)
        sink.on_trouble = self.trouble

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._trouble.set()
        self._thread.join(timeout=self.connect_timeout_s + 10)

    def trouble(self, reason: str | None) -> None:
        """A delivery failed for good (called by the sink): Kafka may be gone again."""
        self.problem = reason
        self._trouble.set()

    def stats(self) -> dict[str, Any]:
        since = self.down_since
        return {
            "state": self.state,
            "problem": self.problem if self.state != "up" else None,
            "down_since": None if since is None else _iso(since),
            "spool_pending": self.sink.spool.pending(self.topics),
            "drained": self.drained,
            "outages": self.outages,
        }

    def attempt(self, timeout_s: float | None = None) -> bool:
        """Try once to reach Kafka, send the spool and go live; on failure, divert and say so."""
        try:
            drained = self._reach(timeout_s or self.connect_timeout_s)
        except UNREACHABLE as exc:
            self._down(str(exc))
            return False
        self._up(drained)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.state != "up" and not self._reconnect():
                return  # stopped while Kafka was away
            self._trouble.wait()
            if self._stop.is_set():
                return
            self._trouble.clear()
            self._down(self.problem or "a delivery to Kafka failed")

    def _reconnect(self) -> bool:
        """Try to reach Kafka, waiting longer after each failure: True once live, False when
        the proxy stops first."""
        try:
            drained = retry(
                lambda _attempt: self._reach(self.connect_timeout_s),
                self.retry_policy,
                UNREACHABLE,
                on_retry=lambda _attempt, exc, _delay: self._down(str(exc)),
                stop=self._stop.is_set,
                wait=self._stop.wait,
            )
        except UNREACHABLE as exc:
            self._down(str(exc))
            return False
        self._up(drained)
        return True

    def _reach(self, timeout_s: float) -> int:
        """Connect and send the spool; how many events it held."""
        producer = self._connect(timeout_s)
        return self.sink.spool.drain(
            self.topics,
            lambda records: self._send(producer, records),
            lambda: self.sink.resume(producer),
        )

    def _connect(self, timeout_s: float) -> KafkaProducer:
        """Check that Kafka answers and has the topics; the producer to deliver with."""
        self._resolve()
        admin = admin_client(self.settings, timeout_ms=int(timeout_s * 1000))
        try:
            existing = set(admin.list_topics())
        finally:
            admin.close()
        missing = [t for t in self.topics if t not in existing]
        if missing:
            raise BrokerError(
                f"topic(s) {missing} do not exist on {self.settings.bootstrap_servers}; create "
                "them with `turnstream topics apply`"
            )
        if self._producer is None:
            sizes = [s.max_message_bytes for s in self.settings.topics if s.name in self.topics]
            self._producer = producer(
                self.settings,
                max_request_size=max(sizes),
                delivery_timeout_ms=30000,
                request_timeout_ms=10000,
                max_block_ms=10000,
            )
        return self._producer

    def _resolve(self) -> None:
        unresolved = []
        for host, port in self.addresses:
            try:
                socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                return
            except OSError as exc:
                unresolved.append(f"{host} ({exc.strerror or exc})")
        raise BrokerError(
            f"Kafka bootstrap host(s) {', '.join(unresolved)} do not resolve (DNS); check "
            f"KAFKA_BOOTSTRAP_SERVERS={self.settings.bootstrap_servers}"
        )

    def _send(self, producer: KafkaProducer, records: list[Record]) -> None:
        """Deliver spooled records; raise unless every one was acknowledged."""
        futures = [producer.send(t, key=k, value=v) for t, k, v in records]
        producer.flush(timeout=30)
        failed = [f for f in futures if not f.succeeded()]
        if failed:
            raise BrokerError(
                f"{len(failed)} spooled event(s) not delivered: {failed[0].exception!r}"
            )
        self.drained += len(records)

    def _down(self, problem: str) -> None:
        now = time.time()
        self.problem = problem
        if self.state != "unreachable":
            self.state = "unreachable"
            self.down_since = now
            self.outages += 1
            moved = self.sink.divert()
            self._reported = now
            log.error(
                "KAFKA UNREACHABLE: %s. Serving anyway: captured turns go to the spool %s "
                "(%d queued event(s) moved there) and are sent when Kafka is back.",
                problem,
                self.sink.spool_dir,
                moved,
            )
        elif now - self._reported >= self.report_every_s:
            self._reported = now
            log.error(
                "Kafka still unreachable after %.0fs (%s); %d event(s) wait in the spool %s",
                now - (self.down_since or now),
                problem,
                self.sink.spool.pending(self.topics),
                self.sink.spool_dir,
            )

    def _up(self, drained: int) -> None:
        was = self.state
        self.state = "up"
        if was == "unreachable":
            log.warning(
                "Kafka at %s is back after %.0fs: %d spooled event(s) sent; capturing live again",
                self.settings.bootstrap_servers,
                time.time() - (self.down_since or time.time()),
                drained,
            )
        elif drained:
            log.info("sent %d event(s) left in the spool by an earlier run", drained)
        self.down_since = None
        self.problem = None
        if not self._ever_up and self.on_up is not None:
            self.on_up()
        self._ever_up = True


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
