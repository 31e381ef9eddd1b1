"""PolicyVersions: follows policy.versions so each turn carries the version being served."""

from __future__ import annotations

import logging
import threading

import orjson

from pipeline.backoff import RetryPolicy, retry
from pipeline.broker.following import Follower
from pipeline.policy_records import PUSH, decode_evaluation, record_kind
from pipeline.proxy import metrics
from pipeline.settings import Settings

log = logging.getLogger(__name__)


class PolicyVersions:
    """The newest version on policy.versions (None until the trainer published one)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = settings.topics.policy_versions.name
        self.current: int | None = None
        self.heldout_version = -1  # of the newest held-out evaluation read (-1: none yet)
        self.retry_policy = RetryPolicy(None, 1.0, settings.proxy.versions_retry_max_s)
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="policy-versions", daemon=True)

    def start(self, wait_s: float = 15.0) -> None:
        """Follow the topic; return once what is on it now has been read (or after wait_s)."""
        self._thread.start()
        if not self._caught_up.wait(wait_s):
            log.warning("%s not read to its end within %.0fs; continuing", self.topic, wait_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():  # never started while Kafka was away
            self._thread.join(timeout=5)

    def observe(self, value: bytes | None) -> None:
        try:
            record = orjson.loads(value or b"null")
            kind = record_kind(record)
            version = int(record["version"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            log.warning("ignoring an unreadable record on %s: %r", self.topic, (value or b"")[:200])
            return
        if kind != PUSH:  # a held-out evaluation of a version served before: its gauges
            self._evaluated(record)
            return
        if self.current is None or version > self.current:
            self.current = version
            metrics.POLICY_VERSION.set(version)
            log.info("policy version %d is now stamped on new turns", version)

    def _evaluated(self, record: dict[str, object]) -> None:
        evaluation = decode_evaluation(record)
        if evaluation is None:
            log.debug("skipping a %r record on %s", record.get("kind"), self.topic)
            return
        if evaluation.version >= self.heldout_version:  # the newest version's
            self.heldout_version = evaluation.version
            for field, gauge in metrics.HELDOUT.items():
                gauge.set(getattr(evaluation, field))

    def _run(self) -> None:
        try:  # the proxy keeps serving; the version may lag meanwhile
            retry(
                lambda _attempt: self._follow(),
                self.retry_policy,
                (Exception,),
                on_retry=self._retrying,
                stop=self._stop.is_set,
                wait=self._stop.wait,
            )
        except Exception as exc:
            log.warning("stopped following %s after a failure: %r", self.topic, exc)

    def _retrying(self, _attempt: int, error: BaseException, delay_s: float) -> None:
        log.error("following %s failed; retrying in %.0fs", self.topic, delay_s, exc_info=error)
        self._caught_up.set()

    def _follow(self) -> None:
        follower = Follower(self.settings, [self.topic])
        try:
            if not follower.partitions:
                log.warning("topic %s does not exist: turns carry no policy version", self.topic)
                return
            while not self._stop.is_set():
                for record in follower.poll(timeout_ms=500):
                    self.observe(record.value)
                if not self._caught_up.is_set() and follower.caught_up():
                    self._caught_up.set()
        finally:
            self._caught_up.set()
            follower.close()
