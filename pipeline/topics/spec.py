"""Load and validate topics.yaml, with one of its profiles; give code the (prefixed) names."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
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
    profile: str | None = None  # the profile of topics.yaml applied, None for its own values
    profiles: tuple[str, ...] = ()  # every profile topics.yaml declares

    @property
    def described(self) -> str:
        """Where these topics come from, for messages: the file, and the profile if any."""
        return f"{self.source} (profile {self.profile})" if self.profile else str(self.source)

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


@dataclass(frozen=True)
class Override:
    """What a profile sets, for every topic or for one: None and {} leave the topic's own."""

    replication_factor: int | None = None
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    """One entry of ``profiles:``: values for every topic, then per topic on top of them."""

    every: Override
    per_topic: dict[str, Override]

    def apply(self, spec: TopicSpec) -> TopicSpec:
        one = self.per_topic.get(spec.logical, Override())
        rf = one.replication_factor or self.every.replication_factor or spec.replication_factor
        configs = {**spec.configs, **self.every.configs, **one.configs}
        return replace(spec, replication_factor=rf, configs=configs)


def _override(where: str, raw: Any, more: frozenset[str] = frozenset()) -> Override:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping")
    unknown = set(raw) - {"replication_factor", "configs"} - more
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    rf = raw.get("replication_factor")
    if rf is not None and (not isinstance(rf, int) or isinstance(rf, bool) or rf < 1):
        raise ConfigError(f"{where}.replication_factor: expected an integer >= 1, got {rf!r}")
    configs = raw.get("configs") or {}
    if not isinstance(configs, dict):
        raise ConfigError(f"{where}.configs: expected a mapping of config name to value")
    return Override(rf, {str(k): str(v) for k, v in configs.items()})


def _profiles(source: Path, raw: Any, logicals: set[str]) -> dict[str, Profile]:
    """The ``profiles:`` mapping of topics.yaml, checked field by field."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: profiles: expected a mapping of profile name to values")
    profiles = {}
    for name, values in raw.items():
        where = f"{source}: profiles.{name}"
        every = _override(where, values, frozenset({"description", "topics"}))
        per_topic = values.get("topics") or {}
        if not isinstance(per_topic, dict):
            raise ConfigError(f"{where}.topics: expected a mapping of topic name to values")
        undeclared = sorted(set(per_topic) - logicals)
        if undeclared:
            raise ConfigError(f"{where}.topics: no such topic(s) in topics: {undeclared}")
        profiles[str(name)] = Profile(
            every, {t: _override(f"{where}.topics.{t}", v) for t, v in per_topic.items()}
        )
    return profiles


def _check_min_insync(source: Path, spec: TopicSpec, profile: str | None) -> None:
    """With acks=all, a topic whose min.insync.replicas exceeds its RF takes no write at all."""
    value = spec.configs.get("min.insync.replicas")
    if value is None:
        return
    where = f"{source}: topics.{spec.logical}" + (f" with profile {profile}" if profile else "")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{where}: min.insync.replicas {value!r} is not an integer >= 1")
    if int(value) > spec.replication_factor:
        raise ConfigError(
            f"{where}: min.insync.replicas {value} exceeds the replication factor "
            f"{spec.replication_factor}, so no acks=all write would ever succeed; lower "
            "min.insync.replicas or raise replication_factor"
        )


def load_topics(path: Path, prefix: str = "", profile: str | None = None) -> Topics:
    """Read topics.yaml; every topic of the design must be there, with sane values.

    ``profile`` names an entry of its ``profiles:`` whose values replace the topics' own.
    """
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("topics"), dict):
        raise ConfigError(f"{path}: expected a top-level 'topics:' mapping")
    unknown = set(data) - {"version", "topics", "profiles"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level field(s) {sorted(unknown)}")
    specs = {
        logical: _topic_spec(path, logical, raw, prefix) for logical, raw in data["topics"].items()
    }
    missing = sorted(set(REQUIRED_TOPICS) - set(specs))
    if missing:
        raise ConfigError(f"{path}: missing topic(s) {missing}; the pipeline needs all of them")
    profiles = _profiles(path, data.get("profiles"), set(specs))
    if profile is not None:
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise ConfigError(f"{path}: no profile {profile!r}; the profiles it declares: {known}")
        specs = {logical: profiles[profile].apply(spec) for logical, spec in specs.items()}
    for spec in specs.values():
        _check_min_insync(path, spec, profile)
    return Topics(specs=specs, source=path, profile=profile, profiles=tuple(profiles))


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read topics file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
