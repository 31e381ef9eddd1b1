"""The shipped prompt set: questions with a known short answer, split into train and held-out.

An answer is correct when the prompt's ``answer`` or one of its ``aliases``
appears in it as a whole word, case-insensitive (``is_correct``). Other tools
check answers by the same rule (``holds_answer``, for answers of their own,
such as a rollout task's ground truth): keep it exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from pipeline.errors import ConfigError
from pipeline.settings import shipped_file

SPLITS = ("train", "heldout")
FIELDS = ("id", "split", "prompt", "answer", "aliases")


@dataclass(frozen=True)
class Prompt:
    id: str
    split: str
    text: str
    answer: str
    aliases: tuple[str, ...] = field(default=())

    @property
    def answers(self) -> tuple[str, ...]:
        """Every right answer: ``answer`` first, then the aliases."""
        return (self.answer, *self.aliases)


def is_correct(text: str | None, prompt: Prompt) -> bool:
    """``prompt``'s answer or an alias appears in ``text`` as a whole word, ignoring case."""
    return holds_answer(text, prompt.answers)


def holds_answer(text: str | None, answers: Iterable[str]) -> bool:
    """One of ``answers`` appears in ``text`` as a whole word, ignoring case (blank ones never)."""
    return any(_whole_word(a).search(text or "") for a in answers if a.strip())


def _whole_word(answer: str) -> re.Pattern[str]:
    # Lookarounds, not \b: an answer may start or end with a non-word character ("-3", "C++").
    return re.compile(rf"(?<!\w){re.escape(answer.strip())}(?!\w)", re.IGNORECASE)


def default_prompts() -> Path:
    return shipped_file("examples/prompts.jsonl", "prompts.jsonl")


def load_prompts(path: Path) -> list[Prompt]:
    """Every prompt of a JSONL file of ``{"id", "split", "prompt", "answer", "aliases"}``
    objects; a line without one of them is an error naming the file, the line and the field."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the prompt set {path}: {exc.strerror}") from exc
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompt = _prompt(line, f"{path}:{number}")
        if prompt.split not in SPLITS:
            raise ConfigError(
                f"{path}:{number}: split must be one of {SPLITS}, got {prompt.split!r}"
            )
        prompts.append(prompt)
    return prompts


def _prompt(line: bytes, where: str) -> Prompt:
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected an object with {', '.join(FIELDS)}")
    missing = [name for name in FIELDS if name not in row]
    if missing:
        raise ConfigError(
            f"{where}: missing {', '.join(missing)} (each line holds {', '.join(FIELDS)})"
        )
    aliases = row["aliases"]
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: aliases must be a list of strings, got {aliases!r}")
    if not isinstance(row["answer"], str | int) or not str(row["answer"]).strip():
        raise ConfigError(f"{where}: answer must be a non-empty string, got {row['answer']!r}")
    return Prompt(
        str(row["id"]), str(row["split"]), str(row["prompt"]), str(row["answer"]), tuple(aliases)
    )


def split(prompts: list[Prompt], name: str) -> list[Prompt]:
    """The prompts of one split; an empty split is an error naming it."""
    chosen = [p for p in prompts if p.split == name]
    if not chosen:
        raise ConfigError(f"the prompt set has no {name!r} prompts")
    return chosen
