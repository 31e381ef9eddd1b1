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


def diff(topics: Topics, state: dict[str, dict[str, Any]]) -> list[Change]:
    """The changes that would make ``state`` (the cluster) match ``topics`` (the file)."""
    changes: list[Change] = []
    for spec in topics:
        cur = state.get(spec.name)
        if cur is None:
            detail = f"create with {spec.partitions} partitions, RF {spec.replication_factor}"
            changes.append(Change("create", spec.name, detail, spec))
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
            detail = (
                f"replication factor {cur['replication_factor']} -> "
                f"{spec.replication_factor} needs a partition reassignment, "
                "which `topics apply` does not do"
            )
            changes.append(Change("refused", spec.name, detail, spec))
        wrong = {k: v for k, v in spec.configs.items() if cur["configs"].get(k) != v}
        if wrong:
            detail = ", ".join(f"{k}: {cur['configs'].get(k)} -> {v}" for k, v in wrong.items())
            changes.append(Change("config", spec.name, detail, spec, wrong))
    return changes


def plan(settings: Settings) -> list[Change]:
    admin = admin_client(settings)
    try:
        return diff(settings.topics, _current_state(admin, [s.name for s in settings.topics]))
    except KafkaError as exc:
        raise BrokerError(
            f"reading topics from {settings.bootstrap_servers} failed: {exc}"
        ) from exc
    finally:
        admin.close()


def apply(settings: Settings) -> list[Change]:
    """Create, grow and reconfigure topics; refuse (changing nothing) what Kafka cannot do."""
    changes = plan(settings)
    refused = [c for c in changes if c.kind == "refused"]
    if refused:
        lines = "\n".join(f"  {c}" for c in refused)
        raise TopicPlanError(
            f"{settings.topics.source} asks for changes Kafka cannot make; nothing was changed:\n"
            f"{lines}\nEdit topics.yaml to match the cluster, or recreate the topic."
        )
    if not changes:
        return []
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
    _wait_converged(settings)
    return changes


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
