"""The rollout stage without a proxy: tasks read, attempts named, retried and dead-lettered."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from pipeline.errors import RolloutError
from pipeline.events import MAX_GROUP_SIZE, MAX_SESSION_ID_CHARS
from pipeline.rollouts.stage import Ending, Progress, RolloutPlan, RolloutStage, ending_of
from pipeline.rollouts.tasks import (
    MAX_RUN_ID_CHARS,
    MAX_TASK_ID_CHARS,
    Attempt,
    Task,
    attempt_input,
    check_run_id,
    decide,
    new_run_id,
    parse_tasks,
    read_tasks,
    rollout_metrics_of,
)
from pipeline.sdk import AgentOutput, RolloutInput, RolloutOutput, TaskStatus

TASK = {"messages": [{"role": "user", "content": "hi"}], "model_resource": {
    "model_name": "theirs", "base_url": "http://elsewhere/v1", "api_key": "secret"}}  # fmt: skip


def lines(*tasks: dict) -> list[bytes]:  # type: ignore[type-arg]
    return [orjson.dumps(t) for t in tasks]


def test_tasks_take_their_id_from_rollout_extra_or_their_line() -> None:
    tasks = parse_tasks(
        [
            *lines({**TASK, "task_id": "q-7"}),
            b"",
            *lines({**TASK, "rollout_extra": {"task_id": 3}}, TASK),
        ],
        "f.jsonl",
        "f",
    )
    assert [(t.task_id, t.source) for t in tasks] == [
        ("q-7", "f.jsonl:1"), ("3", "f.jsonl:3"), ("f-4", "f.jsonl:4")
    ]  # fmt: skip
    assert tasks[0].input.rollout_extra == {"task_id": "q-7"}  # unknown fields are kept
    assert tasks[2].raw == orjson.dumps(TASK)


def test_every_bad_line_is_named_at_once(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    bad = [b"{nope", b"[1]", orjson.dumps({"sampling_params": {"timeout": -1}})]
    path.write_bytes(b"\n".join([*bad, *lines({**TASK, "task_id": "x"}, {**TASK, "task_id": "x"})]))
    with pytest.raises(RolloutError) as err:
        read_tasks(path)
    text = str(err.value)
    for where in (":1: not valid JSON", ":2: expected a JSON object", ":3: not a RolloutInput",
                  "sampling_params.timeout", ":5: task_id 'x' is also"):  # fmt: skip
        assert where in text
    with pytest.raises(RolloutError, match="no tasks"):
        parse_tasks([b"", b"  "], "e.jsonl", "e")
    with pytest.raises(RolloutError, match="cannot read"):
        read_tasks(tmp_path / "missing.jsonl")


def test_attempts_are_fresh_sessions_of_one_group_of_their_run() -> None:
    first = Attempt("r1", "t1", 1, 1)
    assert (first.session_id, first.group_id, first.rollout_id) == (
        "rollout:r1:t1:1:1",
        "rollout:r1:t1",
        "t1:1",
    )
    assert first.again().session_id == "rollout:r1:t1:1:2"
    assert Attempt("r2", "t1", 1, 1).session_id != first.session_id  # a run again: new ones
    assert [decide(True, 1, 3), decide(False, 1, 3), decide(False, 2, 3), decide(False, 3, 3)] == [
        "done", "retry", "retry", "dead_letter"
    ]  # fmt: skip
    assert decide(False, 1, 1) == "dead_letter"


def test_an_attempt_sees_the_route_its_model_name_and_its_ids_with_an_empty_trace() -> None:
    task = parse_tasks(lines({**TASK, "request_metadata": {"job_id": "j"}}), "f", "f")[0]
    task.input.trace.start()
    at = Attempt("r1", "f-1", 0, 2)
    seen = attempt_input(task, at, "http://proxy/rollouts/x/v1", "policy", "")
    assert seen.model_resource.model_dump() == {
        "model_name": "policy",
        "base_url": "http://proxy/rollouts/x/v1",
        "api_key": "",
    }  # fmt: skip  (the task's key belongs to its own server and is not sent on)
    assert seen.request_metadata == {
        "job_id": "j", "run_id": "r1", "rollout_id": "f-1:0", "attempt_id": "2"
    }  # fmt: skip
    assert seen.trace.start() == 0
    kept = attempt_input(task, Attempt("r1", "f-1", 0, 1), "http://proxy/x/v1", None, "")
    assert kept.model_resource.model_name == "theirs"


def test_rollout_metrics_merge_the_outputs_own_over_the_agent_outputs() -> None:
    assert rollout_metrics_of({"a": 1.0, "b": float("nan")}, {"a": 0.0, "c": 2.0}) == {
        "a": 1.0,
        "c": 2.0,
    }
    assert rollout_metrics_of(None, None) == {}


class Scripted:
    """A processor whose outputs for each rollout id are given, in attempt order."""

    def __init__(self, script: dict[str, list[str]], sync: bool = False) -> None:
        self.script = script
        self.calls: list[str] = []

    async def process(self, input: RolloutInput) -> RolloutOutput:
        rollout = input.request_metadata["rollout_id"]  # type: ignore[index]
        self.calls.append(f"{rollout}:{input.request_metadata['attempt_id']}")  # type: ignore[index]
        what = self.script[rollout].pop(0)
        if what == "raise":
            raise ValueError("a bug")
        if what == "slow":
            await asyncio.sleep(5)
        if what == "fail":
            return RolloutOutput(status=TaskStatus.FAILED, error="no luck")
        return RolloutOutput(
            agent_output=AgentOutput(rollout_metrics={"m": 1.0}), status=TaskStatus.SUCCESS
        )


class Ends:
    def __init__(self) -> None:
        self.ended: list[tuple[str, bool, dict[str, float], str | None]] = []
        self.endings: dict[str, Ending] = {}

    async def end(self, session_id: str, ending: Ending) -> None:
        self.ended.append((session_id, ending.succeeded, ending.metrics, ending.error))
        self.endings[session_id] = ending


class Dead:
    def __init__(self) -> None:
        self.letters: list[tuple[str, str, str, bytes]] = []

    def dead_letter_raw(self, stage: str, error: str, source: str, raw: bytes) -> None:
        self.letters.append((stage, error, source, raw))


def run_stage(script: dict[str, list[str]], tasks: list[dict], n: int = 1, **plan: int):  # type: ignore[no-untyped-def,type-arg]
    parsed = parse_tasks(lines(*tasks), "f.jsonl", "f")
    proc, ends, dead = Scripted(script), Ends(), Dead()
    progress = Progress(len(parsed), n)
    stage = RolloutStage(
        proc, RolloutPlan("http://p/v1", "policy", "", n, run_id="r", **plan), ends, dead, progress
    )
    reports: list[str] = []
    asyncio.run(stage.run(parsed, reports.append, every_s=0.05))
    return progress, proc, ends, dead, reports


def test_failures_are_retried_as_fresh_sessions_then_dead_lettered_with_the_error() -> None:
    timed = {**TASK, "task_id": "b", "sampling_params": {"timeout": 0.2}}
    progress, proc, ends, dead, _ = run_stage(
        {"a:0": ["fail", "ok"], "a:1": ["ok"], "b:0": ["raise", "slow", "fail"], "b:1": ["ok"]},
        [{**TASK, "task_id": "a"}, timed],
        n=2,
        max_attempts=3,
    )
    assert (progress.done, progress.dead_lettered, progress.rollouts) == (1, 1, 3)
    assert (progress.attempts, progress.retried) == (7, 3)
    assert sorted(proc.calls) == ["a:0:1", "a:0:2", "a:1:1", "b:0:1", "b:0:2", "b:0:3", "b:1:1"]
    got = {s: (ok, m, e) for s, ok, m, e in ends.ended}
    assert got["rollout:r:a:0:1"] == (False, {}, "no luck")
    assert got["rollout:r:a:0:2"] == (True, {"m": 1.0}, None)
    assert got["rollout:r:b:0:1"][2] == "Scripted.process raised ValueError: a bug"
    assert got["rollout:r:b:0:2"][2] == "timed out after 0.2 s (sampling_params.timeout)"
    [(stage, error, source, raw)] = dead.letters
    assert (stage, source, orjson.loads(raw)["task_id"]) == ("rollout", "f.jsonl:2", "b")
    assert error == "task b rollout 0: 3 attempt(s) failed, the last (rollout:r:b:0:3): no luck"


def test_concurrency_bounds_the_attempts_at_once_and_progress_is_reported() -> None:
    running, peak = [0], [0]

    class Counting(Scripted):
        async def process(self, input: RolloutInput) -> RolloutOutput:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.05)
            running[0] -= 1
            return await super().process(input)

    tasks = [{**TASK, "task_id": str(i)} for i in range(6)]
    parsed = parse_tasks(lines(*tasks), "f", "f")
    proc = Counting({f"{i}:0": ["ok"] for i in range(6)})
    progress = Progress(6, 1)
    stage = RolloutStage(proc, RolloutPlan("http://p/v1", concurrency=2), Ends(), Dead(), progress)
    reports: list[str] = []
    asyncio.run(stage.run(parsed, reports.append, every_s=0.04))
    assert peak[0] == 2 and progress.done == 6
    assert reports and "rollouts/s" in reports[0]
    assert progress.line().startswith("tasks 6/6 (6 done, 0 dead-lettered); rollouts 6/6")


def test_an_end_the_proxy_never_took_fails_a_successful_attempt() -> None:
    class Refusing(Ends):
        async def end(self, session_id: str, ending: Ending) -> None:
            raise RolloutError("proxy away")

    parsed = parse_tasks(lines({**TASK, "task_id": "a"}), "f", "f")
    progress, dead = Progress(1, 1), Dead()
    stage = RolloutStage(Scripted({"a:0": ["ok"]}), RolloutPlan("http://p/v1", max_attempts=1),
                         Refusing(), dead, progress)  # fmt: skip
    asyncio.run(stage.run(parsed, lambda _: None))
    assert progress.dead_lettered == 1 and "could not be ended: proxy away" in dead.letters[0][1]


def test_a_success_ends_with_the_tasks_ground_truth_and_the_rollouts_messages() -> None:
    task = parse_tasks(lines({**TASK, "task_id": "a", "ground_truth": {"answer": 42}}), "f", "f")[0]
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "42"}]
    out = RolloutOutput(
        agent_output=AgentOutput(messages=said, rollout_metrics={"turns": 1.0}),
        status=TaskStatus.SUCCESS,
    )
    ending = ending_of(task, out)
    assert ending == Ending(True, {"turns": 1.0}, None, {"answer": 42}, said)
    assert ending.body() == {
        "status": "success",
        "rollout_metrics": {"turns": 1.0},
        "error": None,
        "ground_truth": {"answer": 42},
        "messages": said,
    }
    failed = ending_of(task, RolloutOutput(status=TaskStatus.FAILED, error="no luck"))
    assert failed.body() == {"status": "failed", "rollout_metrics": {}, "error": "no luck"}
    empty = ending_of(task, RolloutOutput(agent_output=AgentOutput(), status=TaskStatus.SUCCESS))
    assert isinstance(task, Task) and empty.messages is None  # the last turn's own messages


def test_run_ids_are_fresh_checked_and_a_task_may_name_its_own() -> None:
    assert len({new_run_id() for _ in range(50)}) == 50
    assert all(check_run_id(new_run_id()) for _ in range(5))
    assert check_run_id("nightly-2024.06_01") == "nightly-2024.06_01"
    for bad in ("", "a:b", "a/b", "x" * 25):
        with pytest.raises(RolloutError, match="letters, digits"):
            check_run_id(bad)
    assert RolloutPlan("http://p/v1").run_id != RolloutPlan("http://p/v1").run_id
    [task] = parse_tasks(lines({**TASK, "task_id": "a"}), "f", "f")
    ends = Ends()
    plan = RolloutPlan("http://p/v1", run_id="base")
    stage = RolloutStage(Scripted({"a:0": ["ok", "ok"]}), plan, ends, Dead(), Progress(2, 1))
    asyncio.run(stage.run([task, replace(task, run_id="base.2")], lambda _: None))
    assert sorted(s for s, *_ in ends.ended) == ["rollout:base.2:a:0:1", "rollout:base:a:0:1"]


def test_the_longest_task_id_and_run_id_make_a_session_id_that_fits() -> None:
    longest = "t" * MAX_TASK_ID_CHARS
    [task] = parse_tasks(lines({**TASK, "task_id": longest}), "f", "f")
    run = "r" * 24 + ".1000000"  # a given run id, its task taken again a million times
    assert len(run) <= MAX_RUN_ID_CHARS
    attempt = Attempt(run, task.task_id, MAX_GROUP_SIZE - 1, 10**17)
    assert len(attempt.session_id) <= MAX_SESSION_ID_CHARS
    with pytest.raises(RolloutError, match=f"at most {MAX_TASK_ID_CHARS}"):
        parse_tasks(lines({**TASK, "task_id": longest + "t"}), "f", "f")
