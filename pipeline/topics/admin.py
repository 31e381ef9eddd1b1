"""Make a cluster match topics.yaml: plan, apply, and export as Strimzi manifests."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError

from pipeline.broker.clients import admin_client
from pipeline.errors import BrokerError, TopicPlanError
from pipeline.settings import Settings
from pipeline.topics.spec import Topics, TopicSpec

ChangeKind = Literal["create", "partitions", "config", "refused"]


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    topic: str
    detail: str
    spec: TopicSpec
    value: Any = None  # new partition count, or {config: value} to set

    def __str__(self) -> str:
        mark = {"create": "+", "partitions": "~", "config": "~", "refused": "!"}[self.kind]
        return f"{mark} {self.topic}: {self.detail}"


def _current_state(admin: KafkaAdminClient, names: list[str]) -> dict[str, dict[str, Any]]:
    """{topic: {"partitions": n, "replication_factor": rf, "configs": {k: v}}} for existing ones."""
    existing = set(admin.list_topics())
    present = [n for n in names if n in existing]
    if not present:
        return {}
    state: dict[str, dict[str, Any]] = {}
    for topic in admin.describe_topics(present):
        parts = topic["partitions"]
        state[topic["name"]] = {
            "partitions": len(parts),
            "replication_factor": len(parts[0]["replica_nodes"]) if parts else 0,
        }
    resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in present]
    described = admin.describe_configs(resources, config_filter="all").get("topic", {})
    for name in present:
        values = described.get(name, {})
        state[name]["configs"] = {k: v.get("value") for k, v in values.items()}
    return state


def _live_brokers(admin: KafkaAdminClient) -> int:
    """How many brokers can hold replicas now (a fenced one cannot)."""
    brokers = admin.describe_cluster()["brokers"]
    return sum(1 for broker in brokers if not broker.get("is_fenced", False))


def diff(
    topics: Topics, state: dict[str, dict[str, Any]], brokers: int | None = None
) -> list[Change]:
    """The changes that would make ``state`` (the cluster) match ``topics`` (the file).

    ``brokers`` (the cluster's live brokers, None when unknown) refuses a topic that would
    need more replicas than there are brokers to hold them.
    """
    changes: list[Change] = []
    for spec in topics:
        cur = state.get(spec.name)
        if cur is None:
            changes.append(_create(spec, brokers))
            continue
        if spec.partitions > cur["partitions"]:
            detail = f"partitions {cur['partitions']} -> {spec.partitions}"
            changes.append(Change("partitions", spec.name, detail, spec, spec.partitions))
        elif spec.partitions < cur["partitions"]:
            detail = (
                f"topics.yaml asks for {spec.partitions} partitions but the topic has "
                f"{cur['partitions']}; Kafka cannot lower a partition count"
            )
            changes.append(Change("refused", spec.name, detail, spec))
        if spec.replication_factor != cur["replication_factor"]:
            changes.append(_replication_change(spec, cur["replication_factor"], brokers))
        wrong = {k: v for k, v in spec.configs.items() if cur["configs"].get(k) != v}
        if wrong:
            detail = ", ".join(f"{k}: {cur['configs'].get(k)} -> {v}" for k, v in wrong.items())
            changes.append(Change("config", spec.name, detail, spec, wrong))
    return changes


def _create(spec: TopicSpec, brokers: int | None) -> Change:
    detail = f"create with {spec.partitions} partitions, RF {spec.replication_factor}"
    if brokers is not None and spec.replication_factor > brokers:
        detail += f": needs {spec.replication_factor} brokers, the cluster has {brokers}"
        return Change("refused", spec.name, detail, spec)
    return Change("create", spec.name, detail, spec)


def _replication_change(spec: TopicSpec, current: int, brokers: int | None) -> Change:
    """Always refused: a topic's replication factor is no config Kafka can alter."""
    detail = (
        f"replication factor {current} -> {spec.replication_factor}: Kafka cannot change it "
        "by a config, and `topics apply` does not move replicas; reassign the partitions "
        f"with kafka-reassign-partitions.sh (--generate, then --execute a plan of "
        f"{spec.replication_factor} replicas a partition), or recreate the topic"
    )
    if brokers is not None and spec.replication_factor > brokers:
        detail += f" (the cluster has {brokers} broker(s))"
    return Change("refused", spec.name, detail, spec)


def _observe(settings: Settings) -> tuple[dict[str, dict[str, Any]], int]:
    """The cluster's state of the topics of ``settings`` and its number of live brokers."""
    admin = admin_client(settings)
    try:
        state = _current_state(admin, [s.name for s in settings.topics])
        return state, _live_brokers(admin)
    except KafkaError as exc:
        raise BrokerError(
            f"reading topics from {settings.bootstrap_servers} failed: {exc}"
        ) from exc
    finally:
        admin.close()


def plan(settings: Settings) -> list[Change]:
    state, brokers = _observe(settings)
    return diff(settings.topics, state, brokers)


def short_of_brokers(topics: Topics, brokers: int, bootstrap: str) -> str | None:
    """A sentence when ``topics`` want more replicas than the cluster has brokers."""
    rf = max(spec.replication_factor for spec in topics)
    if rf <= brokers:
        return None
    wants = f"profile {topics.profile}" if topics.profile else str(topics.source)
    return (
        f"{wants} wants replication factor {rf} but the cluster at {bootstrap} has "
        f"{brokers} broker(s); start {rf} brokers or more (locally: turnstream kafka start "
        f"--brokers {rf}), or use a profile with a replication factor of {brokers} or less"
    )


def apply(settings: Settings) -> list[Change]:
    """Create, grow and reconfigure topics; refuse (changing nothing) what Kafka cannot do."""
    state, brokers = _observe(settings)
    changes = diff(settings.topics, state, brokers)
    refused = [c for c in changes if c.kind == "refused"]
    if refused:
        shortage = short_of_brokers(settings.topics, brokers, settings.bootstrap_servers)
        lines = "\n".join(f"  {c}" for c in refused)
        raise TopicPlanError(
            (f"{shortage}\n" if shortage else "")
            + f"{settings.topics.described} asks for changes Kafka cannot make; nothing was "
            f"changed:\n{lines}\nEdit topics.yaml to match the cluster, or recreate the topic."
        )
    if changes:
        _make(settings, changes)
        _wait_converged(settings)
    return changes


def _make(settings: Settings, changes: list[Change]) -> None:
    """Send ``changes`` (none of them refused) to the cluster."""
    admin = admin_client(settings)
    try:
        creates = {
            c.topic: {
                "num_partitions": c.spec.partitions,
                "replication_factor": c.spec.replication_factor,
                "configs": c.spec.configs,
            }
            for c in changes
            if c.kind == "create"
        }
        if creates:
            admin.create_topics(creates, wait_for_metadata=True)
        grow = {c.topic: c.value for c in changes if c.kind == "partitions"}
        if grow:
            admin.create_partitions(grow)
        alters = [
            ConfigResource(ConfigResourceType.TOPIC, c.topic, dict(c.value))
            for c in changes
            if c.kind == "config"
        ]
        if alters:
            admin.alter_configs(alters, incremental=True)
    except KafkaError as exc:
        raise BrokerError(f"applying topics to {settings.bootstrap_servers} failed: {exc}") from exc
    finally:
        admin.close()


def _wait_converged(settings: Settings, timeout_s: float = 30.0) -> None:
    """Return once the cluster's metadata shows the applied changes (it lags a little)."""
    deadline = time.monotonic() + timeout_s
    while (pending := plan(settings)) and time.monotonic() < deadline:
        time.sleep(0.25)
    if pending:
        lines = "\n".join(f"  {c}" for c in pending)
        raise BrokerError(
            f"{settings.bootstrap_servers} accepted the changes but still shows, after "
            f"{timeout_s:.0f}s:\n{lines}\nRun `turnstream topics plan` again shortly."
        )


def export_strimzi(
    topics: Topics, cluster: str = "turnstream", namespace: str | None = None
) -> str:
    """KafkaTopic manifests (Strimzi) for every topic, as one multi-document YAML."""
    docs = []
    for spec in topics:
        metadata: dict[str, Any] = {
            "name": spec.name.replace(".", "-").replace("_", "-").lower(),
            "labels": {"strimzi.io/cluster": cluster},
        }
        if namespace:
            metadata["namespace"] = namespace
        docs.append(
            {
                "apiVersion": "kafka.strimzi.io/v1beta2",
                "kind": "KafkaTopic",
                "metadata": metadata,
                "spec": {
                    "topicName": spec.name,
                    "partitions": spec.partitions,
                    "replicas": spec.replication_factor,
                    "config": dict(spec.configs),
                },
            }
        )
    return yaml.safe_dump_all(docs, sort_keys=False)
