"""`turnstream rollout run --topic`: tasks taken from rollout.tasks by a consumer group, on the
real broker, behind the capture proxy and a scoring worker (rules judge).

The scoring worker ends a silent session after a few seconds here (its idle timeout), so a
killed worker's half-done attempt ends, as failed, within the test. Each test waits until
every turn on chat.turns has its sample before it asserts what did not train.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.broker.clients import producer
from pipeline.events import DeadLetter, Sample, SessionEnd, decode_as
from pipeline.settings import Settings
from tests.kafka.helpers import read_all, spawn, turnstream
from tests.kafka.test_proxy import stop
from tests.kafka.test_rollouts import (
    PROCESSOR,
    by_session,
    input_events,
    running_stack,
    samples_when_all_scored,
    task,
)

IDLE = {"TURNSTREAM_SCORING_IDLE_TIMEOUT_S": "3", "TURNSTREAM_SCORING_IDLE_CHECK_INTERVAL_S": "0.5"}


@pytest.fixture
def stack(settings: Settings, cli_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """The policy simulator, the proxy and a scoring worker whose idle timeout is 3 s."""
    with running_stack(settings, cli_env, tmp_path, IDLE) as proxy:
        yield proxy


def feed_args(proxy: str, *args: str) -> list[str]:
    return [
        "rollout", "run", "--processor", PROCESSOR, "--topic", "rollout.tasks",
        "--model-url", proxy + "/v1", "--model-name", "policy-sim", "--progress-every", "1",
        *args,
    ]  # fmt: skip


def submit(env: dict[str, str], path: Path, tasks: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    sent = turnstream("rollout", "submit", "--tasks", str(path), env=env)
    assert sent.returncode == 0, sent.stderr
    assert f"sent {len(tasks)} task(s) to " in sent.stderr


def summary_of(output: str) -> dict[str, Any]:
    """The JSON summary: the last line of the output that is a JSON object."""
    lines = [line for line in output.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1]))


def trained_sessions(samples: dict[str, Sample], events: list[Any]) -> dict[str, str]:
    """Each session that ended as a success (reason client) -> its task id; every one of its
    samples is trainable or excluded for a reason of its own, never rollout_failed."""
    ends = by_session(events, SessionEnd)
    good = {s for s, e in ends.items() if [x.reason for x in e] == ["client"]}
    for sample in samples.values():
        if sample.session_id in good:
            assert sample.exclude_reason != "rollout_failed", sample.sample_id
    return {s: s.split(":")[2] for s in good}


def test_the_tasks_on_the_topic_run_train_and_are_committed(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    tasks = [task("a", "chat"), task("b", "chat"), task("t", "tool")]
    tasks.append({k: v for k, v in task("-", "chat").items() if k != "task_id"})
    submit(cli_env, tmp_path / "tasks.jsonl", tasks)  # the last: named tasks-4 by its key
    done = turnstream(*feed_args(stack, "--until-end", "--n", "2"), env=cli_env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = summary_of(done.stdout)
    run = summary["run_id"]
    topic = settings.topics.rollout_tasks.name
    assert done.stderr.startswith(f"run {run}: tasks from {topic} (group ")
    assert summary | {"seconds": 0} == {
        "run_id": run, "topic": topic, "group": settings.topic_prefix + "turnstream-rollouts",
        "tasks": 4, "done": 4, "dead_lettered": 0, "rollouts": 8, "attempts": 8, "retried": 0,
        "bad_records": 0, "abandoned": 0, "seconds": 0,
    }  # fmt: skip
    assert "task(s) in flight" in done.stderr

    samples = samples_when_all_scored(settings)
    trained = trained_sessions(samples, input_events(settings))
    assert set(trained) == {
        f"rollout:{run}:{t}:{i}:1" for t in ("a", "b", "t", "tasks-4") for i in (0, 1)
    }
    first = samples[f"rollout:{run}:a:0:1:0"]
    assert first.loss_mask == 1 and first.group_id == f"rollout:{run}:a"

    again = turnstream(*feed_args(stack, "--until-end"), env=cli_env)  # all committed
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary_of(again.stdout)["tasks"] == 0, again.stderr[-3000:]


def test_a_record_that_is_no_task_is_dead_lettered_with_its_place_and_committed(
    settings: Settings, cli_env: dict[str, str], stack: str
) -> None:
    topic = settings.topics.rollout_tasks.name
    out = producer(settings, max_request_size=1 << 20)
    sent = {
        b"{nope": out.send(topic, key=b"bad-json", value=b"{nope"),
        b"[1]": out.send(topic, key=b"bad-shape", value=b"[1]"),
        b"ok": out.send(topic, key=b"fine", value=json.dumps(task("fine", "chat")).encode()),
    }
    out.flush()
    where = {raw: f.get(timeout=10) for raw, f in sent.items()}
    out.close()
    done = turnstream(*feed_args(stack, "--until-end"), env=cli_env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "0 task(s) and 2 bad record(s) dead-lettered" in done.stderr
    summary = summary_of(done.stdout)
    assert (summary["done"], summary["bad_records"]) == (1, 2)

    letters = [
        decode_as(DeadLetter, r.value) for r in read_all(settings, settings.topics.deadletter.name)
    ]
    by_raw = {base64.b64decode(d.raw_b64): d for d in letters}
    assert set(by_raw) == {b"{nope", b"[1]"}
    for raw, letter in by_raw.items():
        meta = where[raw]
        assert letter.stage == "rollout"
        assert letter.source == f"{topic}:{meta.partition}@{meta.offset}"
        assert letter.error.startswith(letter.source)
    assert "not valid JSON" in by_raw[b"{nope"].error
    assert "expected a JSON object" in by_raw[b"[1]"].error

    again = turnstream(*feed_args(stack, "--until-end"), env=cli_env)  # committed past them
    assert again.returncode == 0 and summary_of(again.stdout)["tasks"] == 0, again.stderr


def test_two_workers_of_one_group_share_the_partitions(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    ids = [f"s{i}" for i in range(16)]
    submit(cli_env, tmp_path / "tasks.jsonl", [{**task(i, "pause"), "pause_s": 1.0} for i in ids])
    args = feed_args(stack, "--until-end", "--max-in-flight", "1")
    logs = [tmp_path / "feed-a.log", tmp_path / "feed-b.log"]
    procs = [spawn(["pipeline.cli", *args], log, cli_env) for log in logs]
    try:
        codes = [proc.wait(timeout=150) for proc in procs]
    finally:
        for proc in procs:
            stop(proc)
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs
    summaries = [summary_of(out) for out in outputs]
    assert all(s["done"] >= 1 for s in summaries), summaries  # each took its share

    samples = samples_when_all_scored(settings)
    trained = trained_sessions(samples, input_events(settings))
    assert set(trained.values()) == set(ids)  # every task trained, by one worker or the other
    runs = {session.split(":")[1] for session in trained}
    assert runs == {s["run_id"] for s in summaries}


def test_a_worker_killed_mid_task_loses_no_task_and_its_attempt_never_trains(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    marker = tmp_path / "hung"
    tasks = [task(f"c{i}", "chat") for i in range(5)]
    tasks.append({**task("hang", "hang_once", timeout=120), "marker": str(marker)})
    submit(cli_env, tmp_path / "tasks.jsonl", tasks)
    first = spawn(["pipeline.cli", *feed_args(stack, "--max-in-flight", "8")],
                  tmp_path / "first.log", cli_env)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not marker.exists():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    killed = marker.read_text()

    second = turnstream(*feed_args(stack, "--until-end"), env=cli_env)
    assert second.returncode == 0, second.stderr[-3000:]
    rerun = summary_of(second.stdout)
    assert rerun["done"] >= 1 and rerun["run_id"] != killed

    samples = samples_when_all_scored(settings)
    events = input_events(settings)
    trained = trained_sessions(samples, events)
    assert set(trained.values()) == {t["task_id"] for t in tasks}  # no task lost
    assert f"rollout:{rerun['run_id']}:hang:0:1" in trained  # run again, as a new session
    hung = f"rollout:{killed}:hang:0:1"
    assert [e.reason for e in by_session(events, SessionEnd)[hung]] == ["idle_timeout"]
    of_hung = [s for s in samples.values() if s.session_id == hung]
    assert of_hung and all(
        (s.loss_mask, s.exclude_reason) == (0, "rollout_failed") for s in of_hung
    )


def test_sigterm_finishes_the_running_task_commits_it_and_takes_no_more(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    ids = ["p0", "p1", "p2"]
    submit(cli_env, tmp_path / "tasks.jsonl", [{**task(i, "pause"), "pause_s": 3.0} for i in ids])
    log = tmp_path / "feed.log"
    feed = spawn(["pipeline.cli", *feed_args(stack, "--max-in-flight", "1")], log, cli_env)
    try:
        deadline = time.monotonic() + 60
        while "1 task(s) in flight" not in log.read_text():
            assert feed.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(feed.pid, signal.SIGTERM)
        assert feed.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        stop(feed)
    assert "stopping: no more tasks taken, 1 running to their end" in log.read_text()
    assert summary_of(log.read_text())["done"] == 1

    rest = turnstream(*feed_args(stack, "--until-end"), env=cli_env)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert summary_of(rest.stdout)["done"] == 2  # the finished one was committed
    samples = samples_when_all_scored(settings)
    trained = trained_sessions(samples, input_events(settings))
    assert sorted(trained.values()) == ids  # each once
