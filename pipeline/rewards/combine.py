"""Several reward processors, each with a weight, combined into one: loaded from YAML.

```yaml
processors:
  - classpath: examples.rewards.refusal:SafetyProcessor   # or path/to/file.py:Class
    name: safety                  # optional; default: the @reward_func name or class name
    weight: 0.4                   # default 1.0
    options: {}                   # keywords for the class's constructor
    reward_metric_weight:         # optional: score = sum(w * metric) instead of reward_score
      toxicity: 0.7
      refusal: 0.3
  - classpath: pipeline.rewards.prm:PrmJudge
    weight: 0.6
group:                            # optional: turns sharing a group_id, scored together
  classpath: examples.rewards.group:DemoGroupRewardProcessor
  size: 4                         # members to wait for when a turn has no group_size
  timeout_s: 30                   # then score the members present
```

The combined score is ``sum(weight * score)`` over the processors (weights
are not normalised). Each processor's score is reported as the metric
``name`` and its own metrics as ``name/metric``. If any processor FAILED, the
combination is FAILED, naming it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.errors import ConfigError, RewardError
from pipeline.rewards.grouping import GroupPlan, GroupSpec
from pipeline.rewards.loading import load_processor
from pipeline.rewards.protocols import (
    RewardProcessor,
    close_processor,
    processor_name,
    run_processor,
    setup_processor,
)
from pipeline.rewards.types import RewardInput, RewardOutput


class ProcessorSpec(BaseModel):
    """One entry of ``processors:`` in a rewards file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classpath: str = Field(min_length=1)
    name: str | None = None
    weight: float = 1.0
    options: dict[str, Any] = Field(default_factory=dict)
    reward_metric_weight: dict[str, float] | None = None

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value


class RewardsConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    processors: list[ProcessorSpec] = Field(default_factory=list)
    group: GroupSpec | None = None

    @model_validator(mode="after")
    def _something(self) -> RewardsConfig:
        if not self.processors and self.group is None:
            raise ValueError("name at least one reward: a list under processors, or a group")
        return self


@dataclass(frozen=True)
class WeightedProcessor:
    name: str
    processor: RewardProcessor
    weight: float = 1.0
    reward_metric_weight: dict[str, float] | None = field(default=None)


def key_path(loc: tuple[Any, ...]) -> str:
    """A validation error's location as a YAML key path: ``processors[1].weight``."""
    out = ""
    for item in loc:
        out += f"[{item}]" if isinstance(item, int) else (f".{item}" if out else str(item))
    return out


def file_problems(path: Path, exc: ValidationError, drop: int = 0) -> list[str]:
    """Each error of a config file's validation, as ``file: key.path: problem``.

    ``drop`` leading parts of each location are left out (a key the file itself lacks).
    """
    problems = []
    for err in exc.errors(include_url=False):
        problem = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            problem = "required key is missing"
        elif err["type"] == "extra_forbidden":
            problem = "unknown key (check its spelling)"
        problems.append(f"{path}: {key_path(tuple(err['loc'])[drop:]) or '(top level)'}: {problem}")
    return problems


def read_yaml(path: Path) -> Any:
    """The parsed YAML file at ``path``; a file that cannot be read or parsed is a ConfigError."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc


def load_rewards_config(path: Path) -> RewardsConfig:
    """Parse and check a rewards file; errors name the file and the key."""
    data = read_yaml(path)
    try:
        return RewardsConfig.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise ConfigError("\n".join(file_problems(path, exc))) from exc


def build_weighted(config: RewardsConfig, source: str = "rewards") -> WeightedReward:
    """Load every processor of ``config``; errors name ``source`` and the entry's key."""
    members: list[WeightedProcessor] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(config.processors):
        where = f"{source}: processors[{i}]"
        try:
            processor = load_processor(spec.classpath, spec.options, where=f"{where}.classpath: ")
        except RewardError as exc:
            raise ConfigError(str(exc)) from exc
        name = spec.name or processor_name(processor)
        if name in seen:
            raise ConfigError(
                f"{where}.name: {name!r} is already the name of processors[{seen[name]}]; "
                "give each processor its own name"
            )
        seen[name] = i
        members.append(WeightedProcessor(name, processor, spec.weight, spec.reward_metric_weight))
    return WeightedReward(members)


def load_weighted(path: Path) -> WeightedReward:
    """The weighted combination described by the rewards file at ``path``."""
    config = load_rewards_config(path)
    if not config.processors:
        raise ConfigError(
            f"{path}: processors: the file names only a group reward; "
            "a group reward scores several outputs together (see `turnstream reward test --help`)"
        )
    return build_weighted(config, str(path))


@dataclass
class RewardPlan:
    """What a rewards file configures: per-turn processors, a group reward, or both."""

    processor: WeightedReward | None
    group: GroupPlan | None

    def setup(self) -> None:
        if self.processor is not None:
            self.processor.setup()
        if self.group is not None:
            setup_processor(self.group.processor)

    async def close(self) -> None:
        if self.processor is not None:
            await self.processor.close()
        if self.group is not None:
            await close_processor(self.group.processor)


def load_plan(path: Path) -> RewardPlan:
    """Every reward of the file at ``path``, loaded (not set up)."""
    config = load_rewards_config(path)
    weighted = build_weighted(config, str(path)) if config.processors else None
    group = None
    if config.group is not None:
        spec = config.group
        try:
            processor = load_processor(
                spec.classpath, spec.options, where=f"{path}: group.classpath: "
            )
        except RewardError as exc:
            raise ConfigError(str(exc)) from exc
        group = GroupPlan(
            processor, spec.name or processor_name(processor), spec.size, spec.timeout_s
        )
    return RewardPlan(weighted, group)


def metric_weighted_score(name: str, out: RewardOutput, weights: dict[str, float]) -> float:
    """``sum(w * metric)`` over the named metrics of one processor's output."""
    metrics = out.reward.reward_metrics if out.reward else {}
    missing = sorted(set(weights) - set(metrics))
    if missing:
        raise RewardError(
            f"{name}: reward_metric_weight names metric(s) {', '.join(missing)} that the "
            f"processor did not report (it reported: {', '.join(sorted(metrics)) or 'none'})"
        )
    return sum(w * metrics[key] for key, w in weights.items())


class WeightedReward:
    """Runs several processors concurrently and sums their weighted scores."""

    __reward_name__ = "weighted"

    def __init__(self, members: list[WeightedProcessor]) -> None:
        if not members:
            raise RewardError("a weighted reward needs at least one processor")
        self.members = list(members)

    def setup(self) -> None:
        for member in self.members:
            setup_processor(member.processor)

    async def close(self) -> None:
        for member in self.members:
            await close_processor(member.processor)

    async def process(self, input: RewardInput) -> RewardOutput:
        outputs = await asyncio.gather(*(run_processor(m.processor, input) for m in self.members))
        pairs = list(zip(self.members, outputs, strict=True))
        failed = [f"{m.name}: {o.error}" for m, o in pairs if not o.ok]
        if failed:
            return RewardOutput.failed("; ".join(failed))
        total = 0.0
        metrics: dict[str, float] = {}
        for member, out in pairs:
            if member.reward_metric_weight:
                score = metric_weighted_score(member.name, out, member.reward_metric_weight)
            else:
                score = out.score
            total += member.weight * score
            metrics[member.name] = score
            for key, value in out.reward.reward_metrics.items() if out.reward else ():
                metrics[f"{member.name}/{key}"] = value
        return RewardOutput.success(total, metrics)
