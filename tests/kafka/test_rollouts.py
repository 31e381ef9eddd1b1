"""`turnstream rollout run` end to end: the policy simulator behind the capture proxy, the
scoring worker (rules judge) on the real broker, and the rollout stage as a user runs it.

Each test waits until every turn the proxy put on chat.turns has its sample on
samples.scored before it asserts anything about what did not train.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.events import DeadLetter, Sample, SessionEnd, Turn, decode_as, decode_input
from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.training.batch import sample_reward
from tests.kafka.helpers import read_all, spawn, turnstream
from tests.kafka.rollout_processors import FOLLOW_UP, SEARCH_RESULT
from tests.kafka.test_proxy import start_proxy, start_sim, stop

PROCESSOR = "tests.kafka.rollout_processors:ScriptedRollouts"
WORKER_FLAGS = ["--judge", "rules", "--web-port", "0", "--loglevel", "info"]


@contextmanager
def running_stack(
    settings: Settings,
    cli_env: dict[str, str],
    tmp_path: Path,
    worker_env: dict[str, str],
    sim_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """The policy simulator, the proxy in front of it and a scoring worker; the proxy's URL."""
    admin.apply(settings)
    sim, sim_proc = start_sim(tmp_path, *sim_args)
    proxy, proxy_proc = start_proxy(cli_env, sim, tmp_path / "proxy", tmp_path / "proxy.log")
    worker = spawn(
        ["pipeline.cli", "worker", *WORKER_FLAGS, "--data-dir", str(tmp_path / "w")],
        tmp_path / "worker.log",
        {**cli_env, **worker_env},
    )
    try:
        yield proxy
    finally:
        for proc in (worker, proxy_proc, sim_proc):
            stop(proc)


@pytest.fixture
def stack(settings: Settings, cli_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """The stack with the rules judge; the proxy's URL."""
    with running_stack(settings, cli_env, tmp_path, {}) as proxy:
        yield proxy


def task(task_id: str, kind: str, **sampling: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"{kind} task {task_id}: search the weather"}],
        "sampling_params": {"timeout": 20, **sampling},
        "model_resource": {"model_name": "someone-else", "base_url": "http://unused.invalid/v1"},
        "task_id": task_id,
        "kind": kind,
    }


def run_tasks(
    env: dict[str, str], proxy: str, path: Path, tasks: list[dict[str, Any]], *args: str
) -> subprocess.CompletedProcess:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return turnstream(
        "rollout", "run", "--processor", PROCESSOR, "--tasks", str(path),
        "--model-url", proxy + "/v1", "--model-name", "policy-sim", *args, env=env,
    )  # fmt: skip


def input_events(settings: Settings) -> list[Any]:
    return [decode_input(r.value) for r in read_all(settings, settings.topics.chat_turns.name)]


def samples_when_all_scored(settings: Settings, timeout_s: float = 120) -> dict[str, Sample]:
    """Every sample, once each turn on chat.turns has one (the marker that all arrived)."""
    deadline = time.monotonic() + timeout_s
    while True:
        want = {e.sample_id for e in input_events(settings) if isinstance(e, Turn)}
        records = read_all(settings, settings.topics.samples_scored.name)
        samples = {s.sample_id: s for s in (decode_as(Sample, r.value) for r in records)}
        if want and want <= set(samples):
            return samples
        assert time.monotonic() < deadline, f"not scored: {sorted(want - set(samples))}"
        time.sleep(0.5)


def by_session(events: list[Any], kind: type) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for event in events:
        if isinstance(event, kind):
            out.setdefault(event.session_id, []).append(event)
    return out


def test_tasks_run_n_times_as_groups_are_captured_and_train_with_their_metrics(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    tasks = [task("a", "chat"), task("b", "chat"), task("t", "tool")]
    done = run_tasks(cli_env, stack, tmp_path / "tasks.jsonl", tasks, "--n", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    run = summary["run_id"]
    assert summary | {"seconds": 0} == {
        "run_id": run, "tasks": 3, "done": 3, "dead_lettered": 0, "rollouts": 6, "attempts": 6,
        "retried": 0, "seconds": 0,
    }  # fmt: skip
    assert done.stderr.startswith(f"run {run}: 3 task(s) x 2") and "rollouts/s" in done.stderr

    samples = samples_when_all_scored(settings)
    events = input_events(settings)
    turns = by_session(events, Turn)
    assert set(turns) == {f"rollout:{run}:{t}:{i}:1" for t in "abt" for i in (0, 1)}
    for session, got in turns.items():
        group = session.rsplit(":", 2)[0]
        assert [t.turn_index for t in got] == [0, 1]
        assert all(t.group_id == group and t.group_size == 2 for t in got), session
        assert all(t.rollout and t.turn_type == "main" for t in got)
        assert got[0].messages[0].content.startswith(("chat task", "tool task"))
    ends = by_session(events, SessionEnd)
    assert set(ends) == set(turns)
    records = read_all(settings, settings.topics.chat_turns.name)
    for session in turns:  # its end after its turns, on their partition (the last streamed)
        mine = [r for r in records if r.key == session.encode()]
        kinds = [type(decode_input(r.value)) for r in sorted(mine, key=lambda r: r.offset)]
        assert kinds == [Turn, Turn, SessionEnd] and len({r.partition for r in mine}) == 1
    assert all(e[0].reason == "client" for e in ends.values())
    assert ends[f"rollout:{run}:a:0:1"][0].rollout_metrics["calls"] == 2.0

    for t in "ab":  # the follow-up is turn 0's next state; the metrics ride on every sample
        first = samples[f"rollout:{run}:{t}:0:1:0"]
        last = samples[f"rollout:{run}:{t}:0:1:1"]
        assert first.next_state is not None and first.next_state.content == FOLLOW_UP
        assert first.loss_mask == 1 and first.group_id == f"rollout:{run}:{t}"
        words = float(len((last.response.content or "").split()))
        assert first.reward_metrics == {"rollout/calls": 2.0, "rollout/answer_words": words}
        assert last.exclude_reason == "no_next_state"
    tool_turn = samples[f"rollout:{run}:t:1:1:0"]  # the tool call, paired with the tool's result
    assert (
        tool_turn.response.tool_calls
        and tool_turn.response.tool_calls[0]["function"]["name"] == "search"
    )
    assert tool_turn.next_state is not None and tool_turn.next_state.role == "tool"
    assert tool_turn.next_state.content == SEARCH_RESULT
    assert tool_turn.next_state.tool_call_id == tool_turn.response.tool_calls[0]["id"]


def dead_letters(settings: Settings) -> dict[str, DeadLetter]:
    letters = [
        decode_as(DeadLetter, r.value) for r in read_all(settings, settings.topics.deadletter.name)
    ]
    return {json.loads(base64.b64decode(d.raw_b64))["task_id"]: d for d in letters}


def test_failed_attempts_are_retried_then_dead_lettered_and_never_train(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    tasks = [
        task("fails", "fail"),
        task("slow", "slow", timeout=2),
        task("greedy", "greedy", max_turns=3),
        task("fine", "chat"),
    ]
    path = tmp_path / "tasks.jsonl"
    done = run_tasks(
        cli_env, stack, path, tasks, "--max-attempts", "2", "--concurrency", "8", "--run-id", "r1"
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "3 of 4 task(s) dead-lettered" in done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["run_id"] == "r1"
    assert (summary["done"], summary["dead_lettered"], summary["retried"]) == (1, 3, 3)

    letters = dead_letters(settings)
    assert set(letters) == {"fails", "slow", "greedy"}
    assert all(d.stage == "rollout" for d in letters.values())
    assert letters["fails"].error.endswith(
        "2 attempt(s) failed, the last (rollout:r1:fails:0:2): the tool broke"
    )
    assert letters["fails"].source == f"{path}:1"
    assert "timed out after 2 s (sampling_params.timeout)" in letters["slow"].error
    assert "has 3 model call(s) made or in flight, its max_turns (3)" in letters["greedy"].error

    samples = samples_when_all_scored(settings)
    events = input_events(settings)
    turns, ends = by_session(events, Turn), by_session(events, SessionEnd)
    failed = {f"rollout:r1:{t}:0:{a}" for t in ("fails", "slow", "greedy") for a in (1, 2)}
    assert set(turns) == failed | {"rollout:r1:fine:0:1"}
    assert {s: [e.reason for e in ends[s]] for s in failed} == {
        s: ["rollout_failed"] for s in failed
    }
    assert [len(turns[f"rollout:r1:greedy:0:{a}"]) for a in (1, 2)] == [3, 3]  # the 4th refused
    for sample in samples.values():
        if sample.session_id in failed:
            assert (sample.loss_mask, sample.exclude_reason) == (0, "rollout_failed")
            assert sample.judge_calls == 0
    assert samples["rollout:r1:fine:0:1:0"].loss_mask == 1
    trainable = {s.session_id for s in samples.values() if s.loss_mask}
    assert trainable == {"rollout:r1:fine:0:1"}


def test_calls_in_flight_count_towards_max_turns(
    settings: Settings, cli_env: dict[str, str], stack: str, tmp_path: Path
) -> None:
    done = run_tasks(cli_env, stack, tmp_path / "t.jsonl", [task("burst", "burst", max_turns=3)])
    assert done.returncode == 0, done.stderr[-3000:]
    samples = samples_when_all_scored(settings)
    assert len(samples) == 3  # five calls at once: three served and recorded, two refused
    assert {s.reward_metrics["rollout/refused"] for s in samples.values()} == {2.0}


def test_a_group_of_rollouts_is_scored_on_whole_rollouts_with_the_ground_truth(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """Group reward → group advantage: each rollout once, on its AgentOutput and the task's
    ground truth; every turn of a rollout takes its rollout's score and place in the group."""
    rewards = tmp_path / "rewards.yaml"
    rewards.write_text(
        "group:\n  classpath: tests.kafka.rollout_processors:FinalAnswer\n"
        "  name: final\n  timeout_s: 60\n"
    )
    env = {"TURNSTREAM_SCORING_REWARDS": str(rewards)}
    given = {**task("q", "answer"), "ground_truth": "answer 1"}
    with running_stack(settings, cli_env, tmp_path, env) as proxy:
        done = run_tasks(cli_env, proxy, tmp_path / "t.jsonl", [given], "--n", "3")
        assert done.returncode == 0, done.stderr[-3000:]
        samples = samples_when_all_scored(settings)
    assert len(samples) == 6  # three rollouts of two turns, the last without a next state
    [scores] = {tuple(s.group_scores or ()) for s in samples.values()}  # one group
    assert sorted(scores) == [0.0, 0.0, 1.0]
    places = {(s.session_id, s.group_index) for s in samples.values()}
    assert len(places) == 3 and len({i for _, i in places}) == 3  # a place per rollout
    for sample in samples.values():
        rollout = int(sample.session_id.split(":")[3])  # rollout:RUN:TASK:INDEX:ATTEMPT
        assert sample.loss_mask == 1 and sample.exclude_reason is None
        assert sample.score == (1.0 if rollout == 1 else 0.0)
        assert scores[sample.group_index] == sample.score  # type: ignore[index]
        # the rollout's messages: its two prompts, two answers and its final answer
        assert sample.reward_metrics["final/messages"] == 5.0
        assert sample.reward_metrics["final/members"] == 3.0
    advantages = {
        s.session_id: sample_reward(s, "mean") for s in samples.values() if s.turn_index == 0
    }
    assert sorted(advantages.values()) == pytest.approx([-1 / 3, -1 / 3, 2 / 3])


def test_a_call_still_in_flight_when_its_rollout_ends_is_served_but_not_recorded(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """The late call's answer comes after the session's end: it would start a session of
    its own that nothing ends; the proxy serves it and records nothing."""
    tasks = [task("late", "late"), {**task("wait", "pause"), "pause_s": 3}]
    with running_stack(settings, cli_env, tmp_path, {}, ("--latency-ms", "500")) as proxy:
        done = run_tasks(cli_env, proxy, tmp_path / "t.jsonl", tasks, "--concurrency", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        samples = samples_when_all_scored(settings)
        health = json.loads(urllib.request.urlopen(proxy + "/healthz", timeout=10).read())
    turns = by_session(input_events(settings), Turn)
    [late] = [s for s in turns if ":late:" in s]
    assert [t.turn_index for t in turns[late]] == [0]  # the second call was not recorded
    assert health["not_recorded"].get("after_rollout_end") == 1, health
    assert samples[f"{late}:0"].exclude_reason == "no_next_state"
