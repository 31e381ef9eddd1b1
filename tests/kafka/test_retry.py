"""`turnstream retry` on a real broker: samples.retry back to turns.paired (or dead-lettered),
committed as it goes; a requeue that cannot finish says where it stopped."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from pipeline.broker.clients import producer
from pipeline.errors import BrokerError
from pipeline.events import (
    DeadLetter,
    NextState,
    Paired,
    Response,
    RetryRecord,
    Turn,
    decode_as,
    encode,
)
from pipeline.scoring.retry import STEP_RECORDS, requeue
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.kafka.helpers import read_all

RECORDS = 1200  # more than one step: a requeue stopped after its first is stopped halfway


def retry_record(index: int, attempts: int) -> bytes:
    turn = Turn(
        type="turn",
        session_id=f"s{index}",
        ts=1.0,
        turn_index=0,
        turn_type="main",
        messages=[{"role": "user", "content": f"question {index}"}],
        response=Response(content="an answer"),
    )
    pair = Paired(
        sample_id=f"s{index}:0",
        turn=turn,
        next_state=NextState(role="user", content="thanks"),
        first_judged=True,
        paired_ts=1.0,
    )
    failed = RetryRecord(paired=pair, error="judge timed out", attempts=attempts, failed_ts=1.0)
    return encode(failed)


def fill_retry(settings: Settings, attempts: list[int]) -> None:
    """One retry record per entry of ``attempts`` (its failures so far), all on partition 0."""
    topic = settings.topics.samples_retry.name
    out = producer(settings, max_request_size=settings.topics.samples_retry.max_message_bytes)
    try:
        for index, tries in enumerate(attempts):
            out.send(topic, key=b"s%d" % index, value=retry_record(index, tries), partition=0)
        out.flush()
    finally:
        out.close()


def requeued(settings: Settings) -> Counter[str]:
    """How many times each sample_id reached turns.paired, all of them at attempt 2."""
    pairs = [
        decode_as(Paired, r.value) for r in read_all(settings, settings.topics.turns_paired.name)
    ]
    assert {p.attempt for p in pairs} <= {2}
    return Counter(p.sample_id for p in pairs)


def test_every_retry_record_is_requeued_or_dead_lettered_once(settings: Settings) -> None:
    admin.apply(settings)
    attempts = [5 if index % 10 == 0 else 1 for index in range(RECORDS)]  # 1 in 10 exhausted
    fill_retry(settings, attempts)
    report = requeue(settings, max_attempts=5)
    assert (report.requeued, report.dead_lettered) == (RECORDS * 9 // 10, RECORDS // 10)
    assert requeued(settings) == Counter({f"s{i}:0": 1 for i in range(RECORDS) if i % 10})
    letters = [
        decode_as(DeadLetter, r.value) for r in read_all(settings, settings.topics.deadletter.name)
    ]
    assert sorted(d.source for d in letters) == sorted(
        f"{settings.topics.samples_retry.name}/0/{i}" for i in range(0, RECORDS, 10)
    )
    assert all(d.stage == "retry" and "after 5 attempts" in d.error for d in letters)
    assert requeue(settings, max_attempts=5) == type(report)()  # committed: nothing left


def test_a_requeue_that_cannot_finish_names_where_it_stopped_and_keeps_what_it_did(
    settings: Settings,
) -> None:
    admin.apply(settings)
    fill_retry(settings, [1] * RECORDS)
    topic = settings.topics.samples_retry.name
    with pytest.raises(BrokerError) as stopped:
        requeue(settings, timeout_s=1e-6)  # past its time after the first step
    message = str(stopped.value)
    got = re.search(
        rf"requeue of {re.escape(topic)} stopped: .*partition 0 at (\d+) of {RECORDS}", message
    )
    assert got, message
    done = int(got.group(1))
    assert 0 < done <= STEP_RECORDS
    assert f"{done} pair(s) requeued and 0 dead-lettered before that are committed" in message
    assert "run `turnstream retry` again" in message
    assert requeued(settings) == Counter({f"s{i}:0": 1 for i in range(done)})

    report = requeue(settings)  # goes on from the commit: nothing twice, nothing missed
    assert report.requeued == RECORDS - done
    assert requeued(settings) == Counter({f"s{i}:0": 1 for i in range(RECORDS)})
