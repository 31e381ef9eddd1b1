"""The console's reader: samples.scored, policy.versions and reviews into the index.

It is a :class:`~pipeline.broker.following.Follower` (every partition assigned, no
consumer group): the console is a viewer, so it reads each topic whole from its log start
at every start, commits nothing, and shows up as no group's lag; two consoles never split
partitions between them. After a failure it follows again from where it was, and every
``PROBE_S`` it asks the broker for the topics' ends, which says whether the broker is
reachable and how far behind the page is.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.backoff import RetryPolicy
from pipeline.broker.clients import admin_client
from pipeline.broker.connection import unreachable
from pipeline.broker.following import Follower, Partition, log_ends
from pipeline.console.index import ConsoleIndex
from pipeline.errors import BrokerError, EventDecodeError
from pipeline.events import Review, Sample, decode_as
from pipeline.settings import Settings

log = logging.getLogger(__name__)
PROBE_S = 5.0
CONNECT_MS = 5000  # how long a (re)connection may take before the page says the broker is down
REOPEN = RetryPolicy(max_attempts=None, initial_delay_s=1.0, max_delay_s=15.0)


@dataclass(frozen=True)
class ReaderStatus:
    """What the page says about its source; replaced whole by the reader thread."""

    ok: bool
    text: str
    records: int = 0
    behind: int | None = None  # records on the topics not read yet (None: not known)
    undecodable: int = 0


@dataclass
class _Progress:
    """The reader thread's own counters (only that thread touches them)."""

    next_offsets: dict[Partition, int] = field(default_factory=dict)
    records: int = 0
    undecodable: int = 0
    failures: int = 0


class ConsoleReader:
    """Follows the console's topics on the ``console-reader`` thread into ``index``.

    ``status`` is written by that thread alone (one reference, replaced whole) and read by
    the server's handlers, which see the previous or the next status, never a mix.
    """

    def __init__(self, settings: Settings, index: ConsoleIndex) -> None:
        self.settings, self.index = settings, index
        topics = settings.topics
        self.samples_topic = topics.samples_scored.name
        self.versions_topic = topics.policy_versions.name
        self.reviews_topic = topics.reviews.name
        self.topics = [self.samples_topic, self.versions_topic, self.reviews_topic]
        self.status = ReaderStatus(False, f"connecting to Kafka at {settings.bootstrap_servers}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-reader", daemon=True)
        self._progress = _Progress()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:
                self._progress.failures += 1
                why = (
                    str(exc)
                    if isinstance(exc, BrokerError)
                    else f"{unreachable(self.settings)} ({exc})"
                )
                self._set(False, f"{why}; trying again")
                log.warning("console reader: %s", exc)
                self._stop.wait(REOPEN.delay(self._progress.failures))

    def _follow(self) -> None:
        follower = Follower(
            self.settings,
            self.topics,
            self._progress.next_offsets,
            bootstrap_timeout_ms=CONNECT_MS,
        )
        try:
            probed = 0.0
            while not self._stop.is_set():
                for record in follower.poll(timeout_ms=500):
                    self.apply(record)
                if time.monotonic() - probed >= PROBE_S:
                    self._probe()
                    probed = time.monotonic()
        finally:
            follower.close()

    def _probe(self) -> None:
        """Ask for the topics' ends: an exception here (broker gone) reopens the follower."""
        admin_client(self.settings, timeout_ms=CONNECT_MS).close()  # fails fast when it is
        ends = log_ends(self.settings, self.topics)
        behind = sum(max(0, end - self._progress.next_offsets.get(p, 0)) for p, end in ends.items())
        self._progress.failures = 0
        where = f"Kafka at {self.settings.bootstrap_servers}"
        state = "caught up" if behind == 0 else f"{behind} record(s) behind"
        self._set(True, f"reading {', '.join(self.topics)} from {where}: {state}", behind)

    def _set(self, ok: bool, text: str, behind: int | None = None) -> None:
        p = self._progress
        self.status = ReaderStatus(ok, text, p.records, behind, p.undecodable)

    def apply(self, record: Any) -> None:
        """One record of any of the topics into the index (undecodable ones are counted)."""
        p = self._progress
        p.next_offsets[(record.topic, record.partition)] = record.offset + 1
        p.records += 1
        try:
            if record.topic == self.samples_topic:
                self.index.add_sample(decode_as(Sample, record.value))
            elif record.topic == self.versions_topic:
                data = orjson.loads(record.value)
                if isinstance(data, dict):
                    self.index.add_policy_version(data)
            elif record.value is None:
                key = record.key.decode("utf-8", "replace") if record.key else None
                if key is not None:
                    self.index.add_review(key, None)
            else:
                review = decode_as(Review, record.value)
                self.index.add_review(review.sample_id, review)
        except (EventDecodeError, orjson.JSONDecodeError, TypeError) as exc:
            p.undecodable += 1
            log.debug("%s/%d/%d: %s", record.topic, record.partition, record.offset, exc)
