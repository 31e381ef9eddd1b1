"""A worker killed with SIGKILL at the worst instants of a pair loses nothing.

The instants are chosen, not hit by luck: a fault-injecting worker
(tests/kafka/fault_worker.py) holds one record in flight, the test waits until
everything after it was handled and flushed, then kills it and starts a plain
worker in its place.

- a pair handed to the producer but never stored: the session state that
  implies it must not be on the table's changelog either, so the restarted
  worker reads the turn again and emits the pair;
- the pairs stored but the session state not: the restarted worker reads the
  turn again, emits its pair once more (a duplicate, collapsed downstream) and
  goes on pairing the session correctly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.events import Message, Paired, Sample, SessionEnd, Turn, decode_as
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.kafka.helpers import read_all, spawn
from tests.kafka.test_scoring_e2e import stop

WORKER_FLAGS = ["--judge", "rules", "--web-port", "0", "--loglevel", "info"]


def turn(session: str, index: int, user: str) -> Turn:
    return Turn.model_validate(
        {"type": "turn", "session_id": session, "turn_index": index, "turn_type": "main",
         "ts": time.time(), "messages": [{"role": "user", "content": user}],
         "response": {"content": f"answer {index} of {session}"}}
    )  # fmt: skip


def produce(settings: Settings, *events: Turn | Message | SessionEnd) -> None:
    from pipeline.produce.producer import TurnProducer

    with TurnProducer(settings) as producer:
        for event in events:
            producer.send(event)
        producer.flush()


def changelog(settings: Settings) -> str:
    return f"{settings.topic_prefix}{settings.scoring.group_id}-sessions-changelog"


def pending_on_changelog(settings: Settings, session: str) -> list[int | None]:
    """The pending turn index of every changelog record of ``session``, in order."""
    import orjson

    out: list[int | None] = []
    for record in read_all(settings, changelog(settings)):
        if record.key is not None and session in record.key.decode(errors="replace"):
            state = orjson.loads(record.value) if record.value else None
            out.append(((state or {}).get("pending") or {}).get("turn_index"))
    return out


def paired(settings: Settings) -> list[Paired]:
    return [
        decode_as(Paired, r.value) for r in read_all(settings, settings.topics.turns_paired.name)
    ]


def until(what: str, check: Callable[[], bool], proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 90
    while not check():
        assert proc.poll() is None, f"worker exited: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, (
            f"timed out waiting for {what}: {log.read_text()[-3000:]}"
        )
        time.sleep(0.3)


def until_stored(settings: Settings, sample_id: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the pair ``sample_id`` is on turns.paired: the marker before a check that a record
    was *not* written. The worker sends its pairs and its changelog records through one
    producer, which delivers in the order it was handed them (one request in flight to the
    broker), so what it was handed before this pair is stored by then. (A later session's
    state is no marker: the worker writes session states in arrival order, so every one
    after the held record waits for it.)"""
    until(sample_id, lambda: any(p.sample_id == sample_id for p in paired(settings)), proc, log)


def start(env: dict[str, str], tmp: Path, name: str, hold: str | None = None) -> subprocess.Popen:
    flags = [*WORKER_FLAGS, "--data-dir", str(tmp / name)]
    if hold is None:
        return spawn(["pipeline.cli", "worker", *flags], tmp / f"{name}.log", env)
    faulty = {**env, "TURNSTREAM_TEST_HOLD": hold, "TURNSTREAM_TEST_MARK": str(tmp / "held")}
    return spawn(["tests.kafka.fault_worker", *flags], tmp / f"{name}.log", faulty)


def kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def scored(settings: Settings) -> list[Sample]:
    return [
        decode_as(Sample, r.value) for r in read_all(settings, settings.topics.samples_scored.name)
    ]


def test_killed_while_a_pair_is_in_flight_the_pair_is_emitted_after_restart(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    worker = start(cli_env, tmp_path, "faulty", hold="pair:held:0")
    try:
        produce(settings, turn("held", 0, "list the files"), turn("held", 1, "thanks, perfect"))
        until("the held pair", (tmp_path / "held").exists, worker, tmp_path / "faulty.log")
        # The marker: later records are handled and their pair stored while the held one is
        # in flight. A state of "held" written when its turn was handled went to the
        # producer before that pair did, and is on the changelog by now (see until_stored).
        produce(settings, turn("later", 0, "build it"), turn("later", 1, "great, thanks"))
        until_stored(settings, "later:0", worker, tmp_path / "faulty.log")
        # The instant: the pair is not stored, so the state implying it must not be either.
        assert 1 not in pending_on_changelog(settings, "held"), pending_on_changelog(
            settings, "held"
        )
        assert "held:0" not in {p.sample_id for p in paired(settings)}
        kill(worker)

        worker = start(cli_env, tmp_path, "plain")
        produce(
            settings,
            SessionEnd(type="session_end", session_id="held", ts=time.time()),
            SessionEnd(type="session_end", session_id="later", ts=time.time()),
        )
        want = {"held:0", "held:1", "later:0", "later:1"}
        until(
            "every sample",
            lambda: want <= {s.sample_id for s in scored(settings)},
            worker,
            tmp_path / "plain.log",
        )
    finally:
        stop([worker])
    pairs = {p.sample_id: p for p in paired(settings)}
    assert pairs["held:0"].next_state is not None
    assert pairs["held:0"].next_state.content == "thanks, perfect"
    assert pairs["held:1"].next_state is None  # flushed by its session_end


def test_killed_before_the_session_state_is_stored_the_session_pairs_on_correctly(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    worker = start(cli_env, tmp_path, "faulty", hold="state:held:1")
    try:
        produce(settings, turn("held", 0, "list the files"), turn("held", 1, "thanks, perfect"))
        until("the held state", (tmp_path / "held").exists, worker, tmp_path / "faulty.log")
        until_stored(settings, "held:0", worker, tmp_path / "faulty.log")
        # the marker: a session handled after the held state, its pair stored
        produce(settings, turn("marker", 0, "build it"), turn("marker", 1, "great, thanks"))
        until_stored(settings, "marker:0", worker, tmp_path / "faulty.log")
        assert 1 not in pending_on_changelog(settings, "held")
        kill(worker)

        worker = start(cli_env, tmp_path, "plain")
        produce(
            settings,
            turn("held", 2, "no, that's wrong"),
            SessionEnd(type="session_end", session_id="held", ts=time.time()),
        )
        want = {"held:0", "held:1", "held:2"}
        until(
            "every sample",
            lambda: want <= {s.sample_id for s in scored(settings)},
            worker,
            tmp_path / "plain.log",
        )
    finally:
        stop([worker])
    pairs = paired(settings)
    by_id: dict[str, list[Paired]] = {}
    for p in pairs:
        by_id.setdefault(p.sample_id, []).append(p)
    # turn 1 was read again: its pair (held:0) emitted twice, the same both times
    assert [p.next_state.content for p in by_id["held:0"] if p.next_state] == [
        "thanks, perfect"
    ] * 2
    assert [p.next_state.content for p in by_id["held:1"] if p.next_state] == ["no, that's wrong"]
    assert [p.next_state for p in by_id["held:2"]] == [None]
    dead = read_all(settings, settings.topics.deadletter.name)
    assert dead == []  # nothing taken for out of order
