from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.topics import REQUIRED_TOPICS, load_topics
from pipeline.topics.admin import diff, export_strimzi
from tests.conftest import REPO

SHIPPED = REPO / "topics.yaml"


def test_shipped_topics_file_declares_every_topic() -> None:
    topics = load_topics(SHIPPED)
    assert {spec.logical for spec in topics} == set(REQUIRED_TOPICS)
    assert topics.chat_turns.key == "session_id"
    assert topics.policy_versions.configs["cleanup.policy"] == "compact"
    assert topics.samples_scored.max_message_bytes == 16777216
    assert (topics.rollout_tasks.key, topics.rollout_tasks.partitions) == ("task_id", 8)
    for spec in topics:
        assert {
            "cleanup.policy",
            "compression.type",
            "max.message.bytes",
            "min.insync.replicas",
        } <= set(spec.configs)


def test_prefix_applies_to_every_name() -> None:
    topics = load_topics(SHIPPED, prefix="ns1.")
    assert topics.chat_turns.name == "ns1.chat.turns"
    assert all(spec.name == "ns1." + spec.logical for spec in topics)


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _base() -> dict:
    return yaml.safe_load(SHIPPED.read_text())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["topics"].pop("samples.retry"), "missing topic(s) ['samples.retry']"),
        (lambda d: d["topics"]["chat.turns"].update(partitions=0), "chat.turns.partitions"),
        (lambda d: d["topics"]["chat.turns"].update(partitons=3), "unknown field(s) ['partitons']"),
        (lambda d: d["topics"]["chat.turns"].update(configs=[1]), "chat.turns.configs"),
        (lambda d: d.pop("topics"), "expected a top-level 'topics:' mapping"),
    ],
)
def test_bad_topics_file_is_a_clear_error(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = _base()
    mutate(data)
    with pytest.raises(ConfigError) as info:
        load_topics(_write(tmp_path, data))
    assert message in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_unreadable_topics_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read topics file"):
        load_topics(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("topics: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_topics(bad)


def _state_matching(topics) -> dict:  # type: ignore[no-untyped-def]
    return {
        spec.name: {
            "partitions": spec.partitions,
            "replication_factor": spec.replication_factor,
            "configs": dict(spec.configs),
        }
        for spec in topics
    }


def test_diff_of_matching_cluster_is_empty() -> None:
    topics = load_topics(SHIPPED)
    assert diff(topics, _state_matching(topics)) == []


def test_diff_creates_grows_reconfigures_and_refuses() -> None:
    topics = load_topics(SHIPPED)
    state = _state_matching(topics)
    del state["chat.turns"]
    state["turns.paired"]["partitions"] = 4  # file wants 8: grow
    state["samples.scored"]["partitions"] = 16  # file wants 8: refuse
    state["samples.retry"]["replication_factor"] = 3  # file wants 1: refuse
    state["policy.versions"]["configs"]["cleanup.policy"] = "delete"
    changes = {(c.topic, c.kind): c for c in diff(topics, state)}
    assert set(changes) == {
        ("chat.turns", "create"),
        ("turns.paired", "partitions"),
        ("samples.scored", "refused"),
        ("samples.retry", "refused"),
        ("policy.versions", "config"),
    }
    assert changes[("turns.paired", "partitions")].value == 8
    assert "cannot lower" in changes[("samples.scored", "refused")].detail
    assert "replication factor 3 -> 1" in changes[("samples.retry", "refused")].detail
    assert changes[("policy.versions", "config")].value == {"cleanup.policy": "compact"}


def test_strimzi_export_matches_topics_file() -> None:
    topics = load_topics(SHIPPED)
    docs = list(yaml.safe_load_all(export_strimzi(topics, cluster="prod", namespace="rl")))
    assert len(docs) == len(REQUIRED_TOPICS)
    by_name = {d["spec"]["topicName"]: d for d in docs}
    for spec in topics:
        doc = by_name[spec.name]
        assert doc["kind"] == "KafkaTopic" and doc["apiVersion"] == "kafka.strimzi.io/v1beta2"
        assert doc["metadata"]["labels"]["strimzi.io/cluster"] == "prod"
        assert doc["metadata"]["namespace"] == "rl"
        assert doc["spec"]["partitions"] == spec.partitions
        assert doc["spec"]["replicas"] == spec.replication_factor
        assert doc["spec"]["config"] == spec.configs
        assert "." not in doc["metadata"]["name"]


def test_group_lag_is_unknown_while_the_broker_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's lag timer asks during a broker restart: an answer of None, not a crash."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    import pipeline.broker.clients as clients
    import pipeline.broker.following as following
    import pipeline.topics.offsets as offsets
    from pipeline.settings import Settings

    def refuse(**_kw: object) -> None:
        raise KafkaTimeoutError("Unable to bootstrap")

    monkeypatch.setattr(following, "KafkaConsumer", refuse)
    assert offsets.group_lag(Settings(), "g", ["t"]) is None

    class Lost:
        def partitions_for_topic(self, _topic: str) -> set[int]:
            raise KafkaConnectionError("111 ECONNREFUSED")

        def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
            pass

    monkeypatch.setattr(following, "KafkaConsumer", lambda **_kw: Lost())
    monkeypatch.setattr(clients, "admin_client", lambda _settings: Lost())
    assert offsets.group_lag(Settings(), "g", ["t"]) is None
