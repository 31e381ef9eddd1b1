"""Soak: 10,000 hostile events through the real broker and a real worker (make soak).

The events come from the hypothesis strategies of tests/unit/test_hostile_input.py
(undecodable bytes and invalid UTF-8, missing and mistyped fields, deep nesting,
boxes, hints and control characters in user, assistant and tool content, huge
content), drawn deterministically, interleaved with valid sessions and written
raw to chat.turns. The worker must stay up, dead-letter every bad event with its
reason and its bytes, and score every valid pair exactly as a clean run of the
valid events alone does: the judge (simulator) decides the votes, not the text.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.strategies import SearchStrategy
from kafka import KafkaProducer

from pipeline.broker.local import free_port_pair
from pipeline.errors import EventDecodeError
from pipeline.events import DeadLetter, RetryRecord, Sample, decode_as, decode_input
from pipeline.scoring.stages import PairingStage
from pipeline.settings import KafkaSettings, Settings
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets, group_lag
from tests.kafka.helpers import read_all, spawn, wait_http
from tests.kafka.test_scoring_e2e import start_worker, stop
from tests.unit.test_hostile_input import adversarial, hostile

pytestmark = pytest.mark.slow

HOSTILE = 10_000
VALID_TURNS = 600  # in sessions of 3, from the adversarial strategy
WRONG_KEY = 50  # valid events keyed by something else than their session_id
HUGE = 3_000_000  # bytes of content in each of two turns of one session

Event = tuple[bytes, bytes]  # (key, value)


def drawn(strategy: SearchStrategy[Any], n: int) -> list[Any]:
    """``n`` values of ``strategy``: no database, a fixed seed (see ``write_stream``)."""
    values: list[Any] = []

    @hypothesis_settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(value: Any) -> None:
        values.append(value)

    collect()
    return values


def valid_sessions() -> list[Event]:
    """Sessions of three adversarial but valid turns, each closed by a session_end,
    and one session whose two turns carry ~3 MB of content each."""
    turns = [json.loads(raw) for raw in drawn(adversarial, VALID_TURNS)]
    events: list[Event] = []
    for t in range(3):
        for s in range(VALID_TURNS // 3):
            turn = {**turns[s * 3 + t], "session_id": f"adv-{s:04d}", "turn_index": t}
            events.append((f"adv-{s:04d}".encode(), json.dumps(turn).encode()))
    for s in range(VALID_TURNS // 3):
        end = {"type": "session_end", "session_id": f"adv-{s:04d}", "ts": 1.0}
        events.append((f"adv-{s:04d}".encode(), json.dumps(end).encode()))
    for t in range(2):
        turn = {**turns[t], "session_id": "huge", "turn_index": t}
        turn["messages"] = [{"role": "tool", "content": "\\boxed{1} " + "y" * HUGE}]
        turn["response"] = {"content": "[HINT_START]x[HINT_END] " + "z" * HUGE}
        events.append((b"huge", json.dumps(turn).encode()))
    return events


def key_for(raw: bytes, i: int) -> bytes:
    try:
        return decode_input(raw).session_id.encode()
    except EventDecodeError:
        return f"hostile-{i % 16}".encode()


def hostile_stream() -> list[Event]:
    """The hostile events with the valid ones interleaved (each session in order)."""
    bad = [(key_for(raw, i), raw) for i, raw in enumerate(drawn(hostile, HOSTILE))]
    valid = valid_sessions()
    for i in range(WRONG_KEY):  # valid events, keyed by something else: rejected
        key, raw = valid[i]
        valid.append((b"not-" + key, raw.replace(b'"adv-', b'"wk-')))
    rng = random.Random(8)
    slots = set(rng.sample(range(len(bad) + len(valid)), len(valid)))
    b, v = iter(bad), iter(valid)
    return [next(v) if i in slots else next(b) for i in range(len(bad) + len(valid))]


def write_stream(path: str) -> None:
    """Run in a fresh interpreter: hypothesis also draws constants from the local modules
    loaded so far, so only a process that loads the same ones draws the same events."""
    with open(path, "w") as out:
        for key, value in hostile_stream():
            out.write(
                json.dumps([base64.b64encode(key).decode(), base64.b64encode(value).decode()])
            )
            out.write("\n")


def load_stream(path: Path) -> list[Event]:
    code = f"from tests.kafka.test_hostile_worker import write_stream; write_stream({str(path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pairs = (json.loads(line) for line in path.read_text().splitlines())
    return [(base64.b64decode(k), base64.b64decode(v)) for k, v in pairs]


def decodes_with_key(key: bytes, raw: bytes) -> bool:
    try:
        return decode_input(raw).session_id.encode() == key
    except EventDecodeError:
        return False


def expected_outcome(settings: Settings, events: list[Event]) -> tuple[set[str], int]:
    """What the pairing stage makes of ``events`` in-process: (sample ids, dead letters)."""
    stage = PairingStage(settings.topics, idle_timeout_s=1800.0)
    states: dict[str, Any] = {}
    ids, dead = set(), 0
    for i, (key, raw) in enumerate(events):
        result = stage.handle(raw, key, f"x/0/{i}", states.get)
        if result.session_id is not None:
            if result.forget:
                states.pop(result.session_id, None)
            else:
                states[result.session_id] = result.state
        for out in result.outs:
            if out.topic == settings.topics.deadletter.name:
                dead += 1
            else:
                ids.add(json.loads(out.value)["sample_id"])
    return ids, dead


def send_raw(settings: Settings, events: list[Event]) -> None:
    raw = KafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        max_request_size=settings.topics.chat_turns.max_message_bytes,
        linger_ms=5,
    )
    futures = [raw.send(settings.topics.chat_turns.name, key=k, value=v) for k, v in events]
    raw.flush(timeout=300)
    raw.close()
    assert all(f.succeeded() for f in futures)


def run_worker(
    settings: Settings,
    env: dict[str, str],
    url: str,
    events: list[Event],
    want: tuple[set[str], int],
    workdir: Path,
) -> tuple[list[Sample], list[DeadLetter], list[RetryRecord], float]:
    """Write ``events``, score them with one worker; the topics' contents once it is done."""
    admin.apply(settings)
    send_raw(settings, events)
    started = time.monotonic()
    worker = start_worker(env, url, workdir, workdir.with_suffix(".log"))
    ids, dead = want
    deadletter = settings.topics.deadletter.name
    try:
        while True:
            if end_offsets(settings, [deadletter])[deadletter] >= dead:
                samples = read(settings, settings.topics.samples_scored.name, Sample)
                retries = read(settings, settings.topics.samples_retry.name, RetryRecord)
                done = {s.sample_id for s in samples} | {r.paired.sample_id for r in retries}
                if done >= ids:
                    break
            assert worker.poll() is None, workdir.with_suffix(".log").read_text()[-3000:]
            assert time.monotonic() - started < 600, workdir.with_suffix(".log").read_text()[-3000:]
            time.sleep(3)
        elapsed = time.monotonic() - started
        # The end marker: the worker's group has committed every record of its inputs, which
        # it does only once their outputs are stored, so a duplicate would be stored by now.
        for topic in (settings.topics.chat_turns.name, settings.topics.turns_paired.name):
            until_committed(settings, topic, worker, workdir.with_suffix(".log"))
        assert worker.poll() is None, workdir.with_suffix(".log").read_text()[-3000:]
    finally:
        stop([worker])
    samples = read(settings, settings.topics.samples_scored.name, Sample)
    letters = read(settings, settings.topics.deadletter.name, DeadLetter)
    retries = read(settings, settings.topics.samples_retry.name, RetryRecord)
    return samples, letters, retries, elapsed


def until_committed(settings: Settings, topic: str, worker: subprocess.Popen, log: Path) -> None:
    """Until the scoring group has committed ``topic`` to its end (chat.turns first: its
    records make those of turns.paired)."""
    group = settings.topic_prefix + settings.scoring.group_id
    deadline = time.monotonic() + 120
    while group_lag(settings, group, [topic]) != 0:
        assert worker.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{group} never committed all of {topic}"
        time.sleep(1)


def read(settings: Settings, topic: str, model: Any) -> list[Any]:
    return [decode_as(model, r.value) for r in read_all(settings, topic, timeout_s=120)]


def judged(sample: Sample) -> tuple[Any, ...]:
    """What a sample says of its pair (not when or by which process)."""
    return (
        sample.votes,
        sample.score,
        sample.loss_mask,
        sample.exclude_reason,
        sample.judge_calls,
        sample.next_state,
        sample.response,
        sample.messages,
    )


def test_hostile_events_through_a_real_worker(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    stream = load_stream(tmp_path / "stream.jsonl")  # kept there to replay a failure
    clean = [(k, raw) for k, raw in stream if decodes_with_key(k, raw)]
    bad = len(stream) - len(clean)
    digest = hashlib.sha256(b"".join(k + b"\0" + v for k, v in stream)).hexdigest()[:16]
    assert len(stream) >= HOSTILE + VALID_TURNS
    clean_settings = Settings(
        kafka=KafkaSettings(bootstrap_servers=settings.bootstrap_servers),
        topic_prefix=settings.topic_prefix + "clean.",
        producer_linger_ms=0,
    )
    clean_env = {**cli_env, "TURNSTREAM_TOPIC_PREFIX": clean_settings.topic_prefix}
    ids, clean_dead = expected_outcome(settings, clean)
    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--slots", "64", "--agreement", "1.0"],
        tmp_path / "sim.log",
    )  # a vote is a function of the judge prompt alone
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", sim)
        reference = run_worker(
            clean_settings, clean_env, url, clean, (ids, clean_dead), tmp_path / "clean"
        )
        samples, letters, retries, elapsed = run_worker(
            settings, cli_env, url, stream, (ids, bad + clean_dead), tmp_path / "hostile"
        )
    finally:
        sim.kill()
        sim.wait(timeout=10)
    by_id = {s.sample_id: s for s in samples}
    expected = {s.sample_id: s for s in reference[0]}
    boxed_one = [s for s in samples if "\\boxed{1}" in (s.response.content or "") and s.votes]
    print(
        f"\nhostile: {len(stream)} events (sha256 {digest}; {bad} bad, {len(clean)} decodable) "
        f"in {elapsed:.0f}s; "
        f"dead letters {len(letters)} (clean run {len(reference[1])}); samples {len(samples)} "
        f"(clean run {len(reference[0])}), retries {len(retries)}; responses holding "
        f"\\boxed{{1}}: {len(boxed_one)}, scored {dict(Counter(s.score for s in boxed_one))}"
    )
    assert len(letters) == bad + len(reference[1]) == bad + clean_dead
    assert all(d.stage == "pair" and d.error for d in letters)
    too_large = [d for d in reference[1] if "max.message.bytes" in d.error]
    assert [d.error.split()[3] for d in too_large] == ["huge:0"]  # dead-lettered, not lost
    assert [d.error.split()[3] for d in letters if d.truncated] == ["huge:0"]
    assert all(d.source.startswith(settings.topics.chat_turns.name + "/") for d in letters)
    rejected = [raw for key, raw in stream if not decodes_with_key(key, raw)]
    rejected += [base64.b64decode(d.raw_b64) for d in reference[1] if not d.truncated]
    kept = Counter(base64.b64decode(d.raw_b64) for d in letters if not d.truncated)
    assert kept == Counter(rejected)  # each bad event once, with its bytes
    assert not retries and not reference[2]
    assert len(samples) == len(by_id) == len(expected) and set(by_id) == set(expected) == ids
    assert all(judged(by_id[sid]) == judged(expected[sid]) for sid in ids)
    assert all(len(set(s.votes)) <= 1 for s in samples)  # the simulator's one label per prompt
    assert {s.score for s in boxed_one} - {1.0}, "a box in the response decided its score"
