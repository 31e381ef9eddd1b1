"""The shipped prompt set: questions the simulated users ask, split into train and held-out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from pipeline.errors import ConfigError
from pipeline.settings import shipped_file

SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Prompt:
    id: str
    split: str
    text: str


def default_prompts() -> Path:
    return shipped_file("examples/prompts.jsonl", "prompts.jsonl")


def load_prompts(path: Path) -> list[Prompt]:
    """Every prompt of a JSONL file of ``{"id", "split", "prompt"}`` objects."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the prompt set {path}: {exc.strerror}") from exc
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            prompt = Prompt(str(row["id"]), str(row["split"]), str(row["prompt"]))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path}:{number}: expected an object with id, split and prompt ({exc})"
            ) from exc
        if prompt.split not in SPLITS:
            raise ConfigError(
                f"{path}:{number}: split must be one of {SPLITS}, got {prompt.split!r}"
            )
        prompts.append(prompt)
    return prompts


def split(prompts: list[Prompt], name: str) -> list[Prompt]:
    """The prompts of one split; an empty split is an error naming it."""
    chosen = [p for p in prompts if p.split == name]
    if not chosen:
        raise ConfigError(f"the prompt set has no {name!r} prompts")
    return chosen
