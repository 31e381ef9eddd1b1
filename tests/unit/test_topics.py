from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.topics import REQUIRED_TOPICS, load_topics
from pipeline.topics.admin import diff, export_strimzi, short_of_brokers
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


def test_cluster_profile_replicates_every_topic_three_times() -> None:
    plain = load_topics(SHIPPED, prefix="ns1.")
    cluster = load_topics(SHIPPED, prefix="ns1.", profile="cluster")
    assert (plain.profile, cluster.profile) == (None, "cluster")
    assert "cluster" in plain.profiles and plain.profiles == cluster.profiles
    assert [s.name for s in cluster] == [s.name for s in plain]
    assert cluster.chat_turns.name == "ns1.chat.turns"
    for before, after in zip(plain, cluster, strict=True):
        assert (before.replication_factor, after.replication_factor) == (1, 3)
        assert before.configs["min.insync.replicas"] == "1"
        assert after.configs == {**before.configs, "min.insync.replicas": "2"}
        assert (after.partitions, after.key) == (before.partitions, before.key)


def _with_profile(tmp_path: Path, profile: object) -> Path:
    data = _base()
    data["profiles"] = {"big": profile}
    return _write(tmp_path, data)


def test_a_topic_of_a_profile_overrides_what_it_sets_for_every_topic(tmp_path: Path) -> None:
    path = _with_profile(
        tmp_path,
        {
            "replication_factor": 3,
            "configs": {"min.insync.replicas": "2", "retention.ms": "1000"},
            "topics": {
                "policy.versions": {"replication_factor": 5, "configs": {"min.insync.replicas": 3}},
                "reviews": {"configs": {"retention.ms": "5"}},
            },
        },
    )
    topics = load_topics(path, profile="big")
    assert topics.profiles == ("big",)
    assert topics.policy_versions.replication_factor == 5
    assert topics.policy_versions.configs["min.insync.replicas"] == "3"
    assert topics.policy_versions.configs["retention.ms"] == "1000"
    assert (topics.reviews.replication_factor, topics.reviews.configs["retention.ms"]) == (3, "5")
    assert topics.reviews.configs["min.insync.replicas"] == "2"
    assert topics.chat_turns.configs["cleanup.policy"] == "delete"  # the topic's own
    assert load_topics(path).policy_versions.replication_factor == 1


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_topics(SHIPPED, profile="clutser")
    assert str(info.value) == (
        f"{SHIPPED}: no profile 'clutser'; the profiles it declares: cluster"
    )


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"replicas": 3}, "profiles.big: unknown field(s) ['replicas']"),
        ({"replication_factor": 0}, "profiles.big.replication_factor: expected an integer >= 1"),
        ({"configs": ["a"]}, "profiles.big.configs: expected a mapping"),
        ({"topics": {"chat.turns": {"partitions": 9}}}, "profiles.big.topics.chat.turns: unknown"),
        ({"topics": {"chat.turn": {}}}, "profiles.big.topics: no such topic(s) in topics: ['chat"),
        ({"topics": {"reviews": {"replication_factor": "3"}}}, "reviews.replication_factor: exp"),
        ("3 brokers", "profiles.big: expected a mapping"),
    ],
)
def test_bad_profile_is_a_clear_error(tmp_path: Path, profile: object, message: str) -> None:
    path = _with_profile(tmp_path, profile)
    with pytest.raises(ConfigError) as info:
        load_topics(path)  # checked even when no profile is asked for
    assert message in str(info.value) and str(path) in str(info.value)


def test_unknown_top_level_field_is_a_clear_error(tmp_path: Path) -> None:
    data = _base()
    data["profile"] = {"cluster": {"replication_factor": 3}}
    with pytest.raises(ConfigError, match=r"unknown top-level field\(s\) \['profile'\]"):
        load_topics(_write(tmp_path, data))


def test_min_insync_above_the_replication_factor_is_refused(tmp_path: Path) -> None:
    path = _with_profile(tmp_path, {"configs": {"min.insync.replicas": "2"}})
    with pytest.raises(ConfigError) as info:
        load_topics(path, profile="big")
    assert f"{path}: topics.chat.turns with profile big: min.insync.replicas 2 exceeds the " in (
        str(info.value)
    )
    assert "replication factor 1" in str(info.value)
    load_topics(path)  # the topics' own values are consistent
    data = _base()
    data["topics"]["reviews"]["configs"]["min.insync.replicas"] = "two"
    with pytest.raises(ConfigError, match=r"topics\.reviews: min\.insync\.replicas 'two' is not"):
        load_topics(_write(tmp_path, data))


def test_strimzi_export_of_the_cluster_profile() -> None:
    topics = load_topics(SHIPPED, profile="cluster")
    docs = list(yaml.safe_load_all(export_strimzi(topics, cluster="prod", namespace="rl")))
    assert len(docs) == len(REQUIRED_TOPICS)
    assert {d["spec"]["replicas"] for d in docs} == {3}
    assert {d["spec"]["config"]["min.insync.replicas"] for d in docs} == {"2"}


def test_diff_refuses_a_replication_change_and_says_how() -> None:
    topics = load_topics(SHIPPED, profile="cluster")
    state = _state_matching(load_topics(SHIPPED))  # made without the profile
    changes = diff(topics, state, brokers=3)
    refused = {c.topic for c in changes if c.kind == "refused"}
    assert refused == {s.name for s in topics}
    detail = next(c.detail for c in changes if c.kind == "refused")
    assert detail.startswith("replication factor 1 -> 3: Kafka cannot change it by a config")
    assert "kafka-reassign-partitions.sh" in detail and "broker(s)" not in detail
    configs = [c for c in changes if c.kind == "config"]
    assert {c.value["min.insync.replicas"] for c in configs} == {"2"}
    assert "(the cluster has 1 broker(s))" in diff(topics, state, brokers=1)[0].detail


def test_diff_refuses_to_create_more_replicas_than_brokers() -> None:
    topics = load_topics(SHIPPED, profile="cluster")
    assert {c.kind for c in diff(topics, {}, brokers=3)} == {"create"}
    assert {c.kind for c in diff(topics, {})} == {"create"}  # brokers unknown
    changes = diff(topics, {}, brokers=1)
    assert {c.kind for c in changes} == {"refused"}
    assert changes[0].detail == (
        "create with 8 partitions, RF 3: needs 3 brokers, the cluster has 1"
    )


def test_too_few_brokers_is_one_sentence_naming_profile_and_cluster() -> None:
    topics = load_topics(SHIPPED, profile="cluster")
    message = short_of_brokers(topics, 1, "kafka-0:9092")
    assert message is not None and message.startswith(
        "profile cluster wants replication factor 3 but the cluster at kafka-0:9092 has "
        "1 broker(s); "
    )
    assert short_of_brokers(topics, 3, "kafka-0:9092") is None
    assert short_of_brokers(load_topics(SHIPPED), 1, "kafka-0:9092") is None


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
