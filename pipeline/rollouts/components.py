"""Function components of the three kinds, loaded, checked and set up; and the functions file.

A component is a rollout, reward or group reward processor named by a class
path (any form of ``pipeline.rewards.loading``). ``prepare`` loads one, checks
that it is the kind it is listed as (a ``process`` that takes one input, and
nothing it declares, a base class of the SDK or the type of its input or
output, says another kind) and runs its ``setup()``: what a stage does before
its first task. A functions file lists components as the SDK guide's
``register_functions`` registers them; ``check_function`` tries one entry::

    functions:                 # or the list alone
      - name: demo-rollout     # optional
        type: rollout          # rollout | reward | group_reward
        classpath: functions.rollout.rollout_only.DemoRolloutProcessor
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.errors import ConfigError, RewardError, RolloutError, TurnstreamError
from pipeline.rewards.combine import file_problems, read_yaml
from pipeline.rewards.loading import load_processor
from pipeline.rewards.protocols import (
    AbstractGroupRewardProcessor,
    AbstractRewardProcessor,
    close_processor,
    processor_name,
    setup_processor,
)
from pipeline.rewards.types import GroupRewardInput, GroupRewardOutput, RewardInput, RewardOutput
from pipeline.rollouts.protocols import AbstractRolloutProcessor
from pipeline.rollouts.trace import error_text
from pipeline.rollouts.types import RolloutInput, RolloutOutput

FunctionType = Literal["rollout", "reward", "group_reward"]

KIND_NAMES: dict[str, str] = {
    "rollout": "rollout processor",
    "reward": "reward processor",
    "group_reward": "group reward processor",
}
BASES: dict[type, str] = {
    AbstractRolloutProcessor: "rollout",
    AbstractRewardProcessor: "reward",
    AbstractGroupRewardProcessor: "group_reward",
}
INPUTS: dict[Any, str] = {
    RolloutInput: "rollout",
    RewardInput: "reward",
    GroupRewardInput: "group_reward",
}
OUTPUTS: dict[Any, str] = {
    RolloutOutput: "rollout",
    RewardOutput: "reward",
    GroupRewardOutput: "group_reward",
}


class FunctionSpec(BaseModel):
    """One component of a functions file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = None
    type: FunctionType
    classpath: str = Field(min_length=1)


class FunctionsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    functions: list[FunctionSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_once(self) -> FunctionsFile:
        names = [f.name for f in self.functions if f.name]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"name(s) used by more than one entry: {', '.join(twice)}")
        return self


def _signature(process: Any) -> inspect.Signature | None:
    """``process``'s signature with its annotations resolved; None where they cannot be."""
    try:
        return inspect.signature(process, eval_str=True)
    except Exception:  # an annotation naming what its module imports only to type-check
        return None


def declared_kinds(processor: object) -> dict[str, str]:
    """``{kind: why}`` for each kind the processor declares by its base class or annotations."""
    found: dict[str, str] = {}
    for base, kind in BASES.items():
        if isinstance(processor, base):
            found.setdefault(kind, f"it subclasses {base.__name__}")
    signature = _signature(getattr(processor, "process", None))
    if signature is None:
        return found
    params = list(signature.parameters.values())
    given: Any = params[0].annotation if params else None
    if isinstance(given, type) and given in INPUTS:
        found.setdefault(INPUTS[given], f"its process() takes a {given.__name__}")
    returned: Any = signature.return_annotation
    if isinstance(returned, type) and returned in OUTPUTS:
        found.setdefault(OUTPUTS[returned], f"its process() returns a {returned.__name__}")
    return found


def kind_problem(processor: object, kind: str) -> str | None:
    """Why ``processor`` cannot serve as a ``kind`` component, or None."""
    process: Any = getattr(processor, "process", None)
    if not callable(process):
        return f"it has no process() method: not a {KIND_NAMES[kind]}"
    try:
        inspect.signature(process).bind(None)
    except TypeError:
        return f"its process{inspect.signature(process)} does not take one input"
    except ValueError:  # a builtin without a signature: nothing to check
        pass
    others = [(k, why) for k, why in declared_kinds(processor).items() if k != kind]
    if others:
        other, why = others[0]
        return f"listed as {kind}, but it is a {KIND_NAMES[other]} ({why})"
    return None


def prepare(classpath: str, kind: str, where: str = "") -> Any:
    """The component at ``classpath`` as a ``kind``, built and set up; errors prefix ``where``."""
    error = RolloutError if kind == "rollout" else RewardError
    try:
        processor = load_processor(classpath, where=where, kind=KIND_NAMES[kind])
    except RewardError as exc:
        raise error(str(exc)) from exc
    problem = kind_problem(processor, kind)
    if problem is not None:
        raise error(f"{where}{classpath}: {problem}")
    try:
        setup_processor(processor)
    except RewardError as exc:  # an async setup(), which no stage awaits
        raise error(f"{where}{exc}") from exc
    except Exception as exc:
        raise error(f"{where}{processor_name(processor)}.setup() raised {error_text(exc)}") from exc
    return processor


def load_functions(path: Path) -> list[tuple[str, FunctionSpec]]:
    """Each entry of a functions file with its key (``functions[2]``, or ``[2]`` in a bare
    list); a file that cannot be used is a ConfigError naming the file and the key."""
    data = read_yaml(path)
    listed = isinstance(data, list)
    if not listed and not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise ConfigError(f"{path}: expected a list of functions (or functions: a list), got {got}")
    try:
        specs = FunctionsFile.model_validate({"functions": data} if listed else data).functions
    except ValidationError as exc:
        raise ConfigError("\n".join(file_problems(path, exc, drop=int(listed)))) from exc
    key = "" if listed else "functions"
    return [(f"{key}[{i}]", spec) for i, spec in enumerate(specs)]


async def check_function(spec: FunctionSpec, where: str = "") -> str | None:
    """What is wrong with one entry (it does not load, is another kind, its setup fails), or None.

    What its ``setup()`` acquired is released again (``close()``, if it has one).
    """
    try:
        processor = prepare(spec.classpath, spec.type, where)
    except TurnstreamError as exc:
        return str(exc)
    try:
        await close_processor(processor)
    except Exception as exc:
        return f"{where}{processor_name(processor)}.close() raised {error_text(exc)}"
    return None
