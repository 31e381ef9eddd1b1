"""The pure part of the topic feed: what may be committed, run names, tasks from records."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.errors import RolloutError
from pipeline.rollouts.feed import Ledger, RunNames, task_of_record

TASK = {"messages": [{"role": "user", "content": "hi"}]}


def test_a_partition_commits_up_to_its_first_unfinished_task() -> None:
    ledger = Ledger()
    for offset in (10, 11, 12):
        ledger.take(0, offset)
    ledger.take(3, 0)
    assert ledger.to_commit() == {0: 10, 3: 0} and ledger.unfinished == 4
    ledger.finish(0, 11)
    ledger.finish(0, 12)  # finished behind 10: not yet
    assert ledger.to_commit()[0] == 10
    ledger.finish(0, 10)
    assert ledger.to_commit() == {0: 13, 3: 0}
    ledger.committed({0: 13, 3: 0})
    assert ledger.to_commit() == {}  # nothing moved since
    ledger.finish(3, 0)
    assert ledger.to_commit() == {3: 1} and ledger.unfinished == 0


def test_offsets_with_gaps_commit_past_the_last_taken() -> None:
    ledger = Ledger()
    ledger.take(1, 5)
    ledger.take(1, 9)  # 6..8 held no record (compacted, transaction markers)
    ledger.finish(1, 9)
    assert ledger.to_commit() == {1: 5}
    ledger.finish(1, 5)
    assert ledger.to_commit() == {1: 10} and ledger.position(1) == 10


def test_a_dropped_partition_is_forgotten_and_its_late_finishes_ignored() -> None:
    ledger = Ledger()
    ledger.take(2, 0)
    ledger.take(4, 7)
    ledger.drop(2)
    ledger.finish(2, 0)  # a task of the lost partition that ended after the rebalance
    assert ledger.partitions() == {4} and ledger.position(2) is None
    assert ledger.to_commit() == {4: 7}
    ledger.committed({2: 1, 4: 7})  # a partition not held is not recorded
    assert ledger.partitions() == {4}
    ledger.take(2, 0)  # taken again (the partition came back): from the start again
    assert ledger.to_commit() == {2: 0}


def test_a_task_taken_again_gets_a_run_of_its_own() -> None:
    names = RunNames("r1", kept=2)
    assert [names.run_for("a"), names.run_for("b"), names.run_for("a")] == ["r1", "r1", "r1.2"]
    assert names.run_for("a") == "r1.3"
    names.run_for("c")  # "b" is the oldest remembered: forgotten
    assert names.run_for("a") == "r1.4"
    assert names.run_for("b") == "r1"


def record(value: bytes | None, key: bytes | None = None, partition: int = 3, offset: int = 41):  # type: ignore[no-untyped-def]
    return SimpleNamespace(topic="p.rollout.tasks", partition=partition, offset=offset,
                           key=key, value=value)  # fmt: skip


def test_a_record_is_a_task_named_by_itself_its_key_or_its_place() -> None:
    named = task_of_record(record(orjson.dumps({**TASK, "task_id": "q-1"}), key=b"other"))
    assert (named.task_id, named.source) == ("q-1", "p.rollout.tasks:3@41")
    assert task_of_record(record(orjson.dumps(TASK), key=b"k-9")).task_id == "k-9"
    assert task_of_record(record(orjson.dumps(TASK))).task_id == "p3-41"
    assert task_of_record(record(orjson.dumps(TASK))).raw == orjson.dumps(TASK)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"{nope", "p.rollout.tasks:3@41: not valid JSON"),
        (None, "p.rollout.tasks:3@41: an empty record, no RolloutInput"),
        (b"[1]", "p.rollout.tasks:3@41: expected a JSON object"),
        (orjson.dumps({"sampling_params": {"timeout": -1}}), "sampling_params.timeout"),
        (orjson.dumps({**TASK, "task_id": "x" * 200}), "task_id is 200 characters"),
    ],
)
def test_a_record_that_is_no_task_says_what_and_where(value: bytes | None, problem: str) -> None:
    with pytest.raises(RolloutError) as err:
        task_of_record(record(value))
    assert problem in str(err.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --tasks FILE or --topic TOPIC (one of them)"),
        (["--tasks", "t.jsonl", "--topic", "rollout.tasks"], "give --tasks FILE or --topic"),
        (["--tasks", "t.jsonl", "--until-end"], "--until-end and --max-in-flight go with --topic"),
        (["--tasks", "t.jsonl", "--group", "g"], "go with --topic, not --tasks"),
        (["--topic", "rollout.task"], "--topic: "),
        (["--topic", "rollout.tasks", "--run-id", "a:b"], "--run-id: run id 'a:b': 1 to 24"),
    ],
)
def test_options_that_do_not_go_together_exit_2_saying_so(args: list[str], message: str) -> None:
    got = CliRunner().invoke(
        app, ["rollout", "run", "--processor", "m:C", "--model-url", "http://p/v1", *args]
    )
    assert got.exit_code == 2 and message in " ".join(got.output.split()), got.output


def test_the_help_says_how_the_topic_is_shared_and_committed() -> None:
    got = CliRunner().invoke(app, ["rollout", "run", "--help"])
    text = " ".join(got.output.split())
    wanted = ["--topic", "--group", "--until-end", "--max-in-flight", "--run-id", "SIGTERM",
              "committed once every rollout", "rollout:RUN:TASK:INDEX:ATTEMPT"]  # fmt: skip
    for words in wanted:
        assert words in text, words
    got = CliRunner().invoke(app, ["rollout", "submit", "--help"])
    assert got.exit_code == 0 and "keyed by its task id" in " ".join(got.output.split())
