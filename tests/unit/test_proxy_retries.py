"""How the proxy's background threads try again: the Kafka link and the version follower
wait longer after each failure, up to their settings, and end their tries at a stop; the
sink puts retried events back in the order they were offered."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from kafka.errors import KafkaTimeoutError

from pipeline.backoff import RetryPolicy
from pipeline.errors import BrokerError
from pipeline.proxy.link import KafkaLink
from pipeline.proxy.sink import EventSink
from pipeline.proxy.versions import PolicyVersions
from pipeline.settings import ProxySettings, Settings


def settings(**proxy: float) -> Settings:
    return Settings(proxy=ProxySettings(**proxy))


class Outage:
    """``failures`` failures with ``error``, then ``result``; records the waits between."""

    def __init__(self, failures: int, error: Exception, result: object = None) -> None:
        self.failures, self.error, self.result = failures, error, result
        self.tries = 0
        self.waits: list[float] = []
        self.stop_after_waits: int | None = None  # then the thread's stop event is set
        self.stop = threading.Event()

    def __call__(self, *_args: object) -> object:
        self.tries += 1
        if self.tries <= self.failures:
            raise self.error
        return self.result

    def wait(self, seconds: float) -> bool:
        """The stop event's ``wait``, returning at once (a stop is set after some waits)."""
        self.waits.append(seconds)
        if len(self.waits) == self.stop_after_waits:
            self.stop.set()
        return self.stop.is_set()


def link(tmp_path: Path, outage: Outage, **proxy: float) -> KafkaLink:
    sink = EventSink(None, 10, RetryPolicy(3, 1.0, 30.0), tmp_path / "spool")
    kafka = KafkaLink(settings(**proxy), sink, ["t.chat.turns"])
    kafka._reach = outage  # type: ignore[method-assign]
    outage.stop = kafka._stop
    kafka._stop.wait = outage.wait  # type: ignore[method-assign]
    return kafka


def test_the_link_waits_longer_after_each_failure_up_to_its_setting(tmp_path: Path) -> None:
    outage = Outage(6, BrokerError("Kafka at 127.0.0.1:9092 is not reachable"), result=0)
    kafka = link(tmp_path, outage, reconnect_max_s=5.0)
    assert kafka._reconnect() is True
    assert outage.tries == 7 and outage.waits == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert kafka.state == "up" and kafka.outages == 1 and kafka.problem is None


def test_a_stop_ends_the_links_tries(tmp_path: Path) -> None:
    outage = Outage(10**6, OSError("connection refused"))
    outage.stop_after_waits = 3
    kafka = link(tmp_path, outage)  # the default: up to 30 s between tries
    assert kafka._reconnect() is False
    assert outage.tries == 3 and outage.waits == [1.0, 2.0, 4.0]
    assert kafka.state == "unreachable" and kafka.problem == "connection refused"


def test_the_version_follower_tries_again_up_to_its_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    versions = PolicyVersions(settings(versions_retry_max_s=1.5))
    outage = Outage(3, RuntimeError("coordinator not available"))
    versions._follow = outage  # type: ignore[method-assign]
    versions._stop.wait = outage.wait  # type: ignore[method-assign]
    versions._run()
    assert outage.tries == 4 and outage.waits == [1.0, 1.5, 1.5]
    assert versions._caught_up.is_set()  # start() does not wait for a topic it cannot read
    failures = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(failures) == 3 and all(r.exc_info for r in failures)  # with their tracebacks


def test_events_that_failed_together_are_retried_in_the_order_offered(tmp_path: Path) -> None:
    """Two turns of one session fail together; each retry falls due on its own timer, the
    first one's first: both go back before what came after them, in the order offered
    (put back at the front one by one, the second turn went out first, and the pairing
    stage dead-letters a turn that arrives after a later one of its session)."""
    sink = EventSink(None, 10, RetryPolicy(3, 0.05, 1.0), tmp_path / "spool")
    for value in (b"s1 turn 2", b"s1 turn 3", b"s2 turn 0"):
        assert sink.offer("t.chat.turns", value.split()[0], value)
    with sink._cv:  # what the sender does: both turns of s1 handed to the producer
        sent = [sink._queue.popleft(), sink._queue.popleft()]
        sink._in_flight += 2
    for item in sent:  # their deliveries expire, the first first
        item.attempts += 1
        sink._failed(item, KafkaTimeoutError("Expiring 1 record(s)"))
    deadline = time.monotonic() + 5
    while sink._held:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [p.value for p in sink._queue] == [b"s1 turn 2", b"s1 turn 3", b"s2 turn 0"]
    assert sink.retried == 2 and sink.spooled == 0 and sink.depth == 3
