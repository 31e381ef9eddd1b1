"""Agreement of a reward processor with a labelled gold set (Spearman rho, Cohen kappa).

A gold file is JSON Lines: each line a reward input (the shape ``turnstream
reward test`` reads) with a numeric ``label`` added, e.g. -1, 0, 1 from a
human, and optionally a ``hint``: the hindsight a hint judge should give for it (a
string, or null). Rho compares the raw scores with the labels; kappa and the confusion
table use each score binned to the nearest label value (a tie goes to the
lower label).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import ValidationError

from pipeline.errors import RewardError
from pipeline.rewards.protocols import RewardProcessor, run_processor
from pipeline.rewards.stats import ConfusionTable, cohen_kappa, confusion_table, spearman_rho
from pipeline.rewards.types import RewardInput, RewardOutput


@dataclass(frozen=True)
class GoldItem:
    line: int
    label: float
    input: RewardInput
    hint: str | None = None  # what a hint vote should say (OPD), when the item has one


@dataclass(frozen=True)
class AgreementReport:
    n: int
    rho: float | None
    kappa: float | None
    table: ConfusionTable
    failed: list[tuple[int, str]] = field(default_factory=list)  # (line, error)


def _problem(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
    return f"{loc}: {msg}" if loc else msg


def _gold_item(lineno: int, text: str) -> GoldItem:
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    label = data.pop("label", None)
    if isinstance(label, bool) or not isinstance(label, int | float) or not math.isfinite(label):
        raise ValueError(f"label: expected a number, got {label!r}")
    hint = data.pop("hint", None)
    if hint is not None and not (isinstance(hint, str) and hint.strip()):
        raise ValueError(f"hint: expected a non-empty string or null, got {hint!r}")
    try:
        return GoldItem(lineno, float(label), RewardInput.model_validate(data), hint)
    except ValidationError as exc:
        raise ValueError(_problem(exc)) from exc


def load_gold(path: Path) -> list[GoldItem]:
    """Every labelled input of a gold file; a bad line is an error naming file:line."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise RewardError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_gold(lines, str(path))


def parse_gold(lines: Sequence[str], source: str) -> list[GoldItem]:
    """Every labelled input of gold lines read from ``source`` (a file, a topic); a bad
    line is an error naming source:line."""
    items, problems = [], []
    for lineno, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            items.append(_gold_item(lineno, text))
        except ValueError as exc:
            problems.append(f"{source}:{lineno}: {exc}")
    if problems:
        raise RewardError("bad gold set:\n" + "\n".join(problems))
    if not items:
        raise RewardError(f"{source}: no labelled inputs")
    return items


def nearest_label(score: float, labels: Sequence[float]) -> float:
    """The label closest to ``score`` (the lower one on a tie)."""
    return min(sorted(labels), key=lambda label: abs(label - score))


def agreement(labels: Sequence[float], scores: Sequence[float]) -> AgreementReport:
    """Rho of raw scores against labels; kappa and confusion of scores binned to labels."""
    values = sorted(set(labels))
    predicted = [nearest_label(s, values) for s in scores]
    return AgreementReport(
        n=len(labels),
        rho=spearman_rho(labels, scores),
        kappa=cohen_kappa(labels, predicted),
        table=confusion_table(labels, predicted),
    )


async def score_gold(
    processor: RewardProcessor, items: Sequence[GoldItem], concurrency: int = 8
) -> list[RewardOutput]:
    """The processor's output for each gold item, at most ``concurrency`` at a time."""
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(item: GoldItem) -> RewardOutput:
        async with limit:
            return await run_processor(processor, item.input)

    return list(await asyncio.gather(*(one(item) for item in items)))


def report(items: Sequence[GoldItem], outputs: Sequence[RewardOutput]) -> AgreementReport:
    """Agreement over the items that scored; FAILED ones are listed, not counted."""
    scored = [(i.label, o.score) for i, o in zip(items, outputs, strict=True) if o.ok]
    failed = [(i.line, o.error or "") for i, o in zip(items, outputs, strict=True) if not o.ok]
    result = agreement([label for label, _ in scored], [score for _, score in scored])
    return AgreementReport(result.n, result.rho, result.kappa, result.table, failed)


def describe(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.4f}"


def render(result: AgreementReport) -> str:
    lines = [
        f"scored: {result.n}   failed: {len(result.failed)}",
        f"Spearman rho: {describe(result.rho)}   (scores vs labels, ties at average rank)",
        f"Cohen kappa:  {describe(result.kappa)}   (scores binned to the nearest label)",
        "confusion (rows: gold label, columns: predicted):",
        result.table.render(),
    ]
    lines += [f"FAILED line {line}: {error}" for line, error in result.failed]
    return "\n".join(lines)
