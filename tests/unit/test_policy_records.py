"""The two kinds of record on policy.versions: the trainer's pushes and held-out evaluations
of a version; each reader takes the kind it needs and skips the other."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import REGISTRY

from pipeline.console.figures import version_rows
from pipeline.console.index import ConsoleIndex
from pipeline.learn.evaluate import EvalResult
from pipeline.learn.monitor import Monitor
from pipeline.policy_records import (
    EVALUATION,
    PUSH,
    HeldoutEvaluation,
    decode_evaluation,
    record_kind,
)
from pipeline.proxy.versions import PolicyVersions
from pipeline.settings import Settings
from pipeline.training.weights import PolicyVersion


def evaluation(version: int, accuracy: float = 0.5, **kw: object) -> HeldoutEvaluation:
    fields = {
        "ts": 100.0 + version, "n": 93, "heldout_accuracy": accuracy, "heldout_success": 0.25,
        "mean_words": 11.5, "degenerate": 0.0, "label": f"version {version}", **kw,
    }  # fmt: skip
    return HeldoutEvaluation(version=version, **fields)  # type: ignore[arg-type]


def push(version: int, reward: float = 0.0) -> bytes:
    metrics = {"reward_mean": reward, "entropy": 1.0, "kl": 0.1, "response_length": 9.0}
    return PolicyVersion(version, f"/w/v{version}", version, 50.0 + version, metrics).encode()


def test_a_record_without_a_kind_is_a_push_and_an_evaluation_round_trips() -> None:
    pushed = orjson.loads(push(3))
    assert record_kind(pushed) == PUSH and decode_evaluation(pushed) is None
    e = evaluation(4, accuracy=0.355)
    decoded = orjson.loads(e.encode())
    assert record_kind(decoded) == EVALUATION and decoded["version"] == 4
    assert decode_evaluation(decoded) == e
    assert decode_evaluation({**decoded, "heldout_accuracy": "high"}) is None
    assert decode_evaluation({"kind": EVALUATION, "version": 1}) is None  # no figures
    assert record_kind({"kind": 7, "version": 1}) == ""  # neither kind
    with pytest.raises(ValueError, match="n > 0 answers"):
        evaluation(1, n=0)


def test_an_evaluation_of_one_version_becomes_its_record() -> None:
    result = EvalResult("after", 4, met=1, mean_words=9.25, versions={"16": 4}, correct=3)
    record = result.record(ts=7.0)
    assert record is not None
    assert (record.version, record.n, record.label, record.ts) == (16, 4, "after", 7.0)
    assert (record.heldout_accuracy, record.heldout_success) == (0.75, 0.25)
    assert (record.mean_words, record.degenerate) == (9.25, 0.0)
    for versions in ({"15": 2, "16": 2}, {"unknown": 4}, {"16": 3}):  # mixed, unnamed, short
        assert EvalResult("after", 4, 1, 9.0, versions, 3).record(7.0) is None, versions


def gauge(name: str) -> float | None:
    return REGISTRY.get_sample_value(f"turnstream_policy_{name}")


def test_the_proxy_stamps_pushes_only_and_exports_the_newest_evaluation() -> None:
    versions = PolicyVersions(Settings())
    versions.observe(push(2))
    versions.observe(evaluation(8, accuracy=0.4).encode())  # a version not pushed yet here
    assert versions.current == 2  # an evaluation never changes the version stamped
    assert gauge("heldout_version") == 8 and gauge("heldout_accuracy") == 0.4
    versions.observe(evaluation(4, accuracy=0.9).encode())  # an older version's, read late
    assert gauge("heldout_version") == 8 and gauge("heldout_accuracy") == 0.4
    versions.observe(evaluation(12, accuracy=0.3, degenerate=0.02).encode())
    assert gauge("heldout_accuracy") == 0.3 and gauge("heldout_degenerate") == 0.02
    assert gauge("heldout_success") == 0.25 and gauge("heldout_mean_words") == 11.5
    versions.observe(b'{"kind": "evaluation", "version": 20}')  # no figures: skipped
    assert gauge("heldout_version") == 12
    versions.observe(push(3))
    assert versions.current == 3


def test_learns_monitor_counts_pushes_only() -> None:
    monitor = Monitor.__new__(Monitor)  # its Kafka follower is not needed to read a record
    monitor.pushes = []
    for value in (push(1), evaluation(1).encode(), push(2), evaluation(2).encode()):
        monitor._push(value)
    assert [p.version for p in monitor.pushes] == [1, 2]
    assert monitor.version == 2


def test_the_console_joins_an_evaluation_to_its_versions_push_in_either_order() -> None:
    index = ConsoleIndex()
    index.add_policy_version(orjson.loads(push(1, reward=-0.5)))
    index.add_policy_version(orjson.loads(evaluation(1, accuracy=0.30).encode()))
    index.add_policy_version(orjson.loads(evaluation(2, accuracy=0.20).encode()))
    index.add_policy_version(orjson.loads(push(2, reward=0.5)))  # its evaluation came first
    index.add_policy_version(orjson.loads(evaluation(0, accuracy=0.25).encode()))  # no push
    index.add_policy_version({"kind": "retraction", "version": 2})  # another kind: ignored
    policy = index.snapshot().policy
    assert policy[1]["path"] == "/w/v1" and policy[1]["heldout_accuracy"] == 0.30
    assert policy[2]["path"] == "/w/v2" and policy[2]["heldout_accuracy"] == 0.20
    assert "kind" not in policy[0] and "label" not in policy[0]
    rows = {r.version: r for r in version_rows(index.snapshot())}
    assert [rows[v].heldout_accuracy for v in (0, 1, 2)] == [0.25, 0.30, 0.20]
    # the step metrics on version 2's push were measured on version 1's weights
    assert rows[1].train_reward == 0.5 and rows[0].train_reward == -0.5
