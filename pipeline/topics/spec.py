"""Load and validate topics.yaml; give code the (prefixed) names to use."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError

# The logical topics of the design; code refers to them through Topics attributes.
REQUIRED_TOPICS = (
    "chat.turns",
    "turns.paired",
    "samples.scored",
    "samples.retry",
    "pipeline.deadletter",
    "policy.versions",
    "rollout.tasks",
    "reviews",
)


@dataclass(frozen=True)
class TopicSpec:
    """One topic as topics.yaml declares it; ``name`` already carries the prefix."""

    logical: str
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    description: str = ""

    @property
    def max_message_bytes(self) -> int:
        return int(self.configs.get("max.message.bytes", 1048588))


@dataclass(frozen=True)
class Topics:
    """All topics of the pipeline, by logical name."""

    specs: dict[str, TopicSpec]
    source: Path

    def __getitem__(self, logical: str) -> TopicSpec:
        try:
            return self.specs[logical]
        except KeyError:
            raise ConfigError(f"{self.source}: no topic '{logical}' declared") from None

    def __iter__(self) -> Iterator[TopicSpec]:
        return iter(self.specs.values())

    @property
    def chat_turns(self) -> TopicSpec:
        return self["chat.turns"]

    @property
    def turns_paired(self) -> TopicSpec:
        return self["turns.paired"]

    @property
    def samples_scored(self) -> TopicSpec:
        return self["samples.scored"]

    @property
    def samples_retry(self) -> TopicSpec:
        return self["samples.retry"]

    @property
    def deadletter(self) -> TopicSpec:
        return self["pipeline.deadletter"]

    @property
    def policy_versions(self) -> TopicSpec:
        return self["policy.versions"]

    @property
    def rollout_tasks(self) -> TopicSpec:
        return self["rollout.tasks"]

    @property
    def reviews(self) -> TopicSpec:
        return self["reviews"]


def _topic_spec(source: Path, logical: str, raw: Any, prefix: str) -> TopicSpec:
    where = f"{source}: topics.{logical}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = set(raw) - {"description", "key", "partitions", "replication_factor", "configs"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    partitions = raw.get("partitions")
    rf = raw.get("replication_factor", 1)
    if not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"{where}.partitions: expected an integer >= 1, got {partitions!r}")
    if not isinstance(rf, int) or rf < 1:
        raise ConfigError(f"{where}.replication_factor: expected an integer >= 1, got {rf!r}")
    configs = raw.get("configs") or {}
    if not isinstance(configs, dict):
        raise ConfigError(f"{where}.configs: expected a mapping of config name to value")
    return TopicSpec(
        logical=logical,
        name=prefix + logical,
        partitions=partitions,
        replication_factor=rf,
        configs={str(k): str(v) for k, v in configs.items()},
        key=raw.get("key"),
        description=str(raw.get("description", "")),
    )


def load_topics(path: Path, prefix: str = "") -> Topics:
    """Read topics.yaml; every topic of the design must be there, with sane values."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read topics file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("topics"), dict):
        raise ConfigError(f"{path}: expected a top-level 'topics:' mapping")
    specs = {
        logical: _topic_spec(Path(path), logical, raw, prefix)
        for logical, raw in data["topics"].items()
    }
    missing = sorted(set(REQUIRED_TOPICS) - set(specs))
    if missing:
        raise ConfigError(f"{path}: missing topic(s) {missing}; the pipeline needs all of them")
    return Topics(specs=specs, source=Path(path))
