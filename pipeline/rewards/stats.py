"""Agreement statistics as pure functions: ranks, Pearson, Spearman, Cohen's kappa, confusion.

Each returns None where the statistic is undefined (fewer than two points, a
constant series, or chance agreement of 1), never NaN.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1; tied values share the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        rank = (start + end) / 2 + 1
        for k in range(start, end + 1):
            ranks[order[k]] = rank
        start = end + 1
    return ranks


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r; None for fewer than two pairs or a constant series."""
    if len(xs) != len(ys):
        raise ValueError(f"pearson needs equal lengths, got {len(xs)} and {len(ys)}")
    n = len(xs)
    if n < 2:
        return None
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    syy = math.fsum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def spearman_rho(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's r of the average ranks (correct with ties)."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman_rho needs equal lengths, got {len(xs)} and {len(ys)}")
    return pearson(average_ranks(xs), average_ranks(ys))


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two raters' labels: (p_o - p_e) / (1 - p_e)."""
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa needs equal lengths, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    expected = math.fsum(ca[k] * cb[k] for k in ca) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1 - expected)


def _label_order(labels: set[Any]) -> list[Any]:
    if all(isinstance(x, int | float) and not isinstance(x, bool) for x in labels):
        return sorted(labels)
    return sorted(labels, key=str)


@dataclass(frozen=True)
class ConfusionTable:
    """Counts of (gold label, predicted label); rows are gold, columns predicted."""

    labels: list[Any]
    counts: dict[tuple[Any, Any], int]

    def count(self, gold: Any, predicted: Any) -> int:
        return self.counts.get((gold, predicted), 0)

    def render(self) -> str:
        """A plain-text table: a row per gold label, a column per predicted label."""
        names = [_fmt(label) for label in self.labels]
        width = max(len("gold \\ pred"), *(len(n) for n in names), 5)
        lines = ["gold \\ pred".ljust(width) + "".join(n.rjust(width + 2) for n in names)]
        for gold, gname in zip(self.labels, names, strict=True):
            row = "".join(str(self.count(gold, p)).rjust(width + 2) for p in self.labels)
            lines.append(gname.ljust(width) + row)
        return "\n".join(lines)


def _fmt(label: Any) -> str:
    return f"{label:g}" if isinstance(label, float) else str(label)


def confusion_table(gold: Sequence[Hashable], predicted: Sequence[Hashable]) -> ConfusionTable:
    if len(gold) != len(predicted):
        raise ValueError(f"confusion_table needs equal lengths, got {len(gold)}, {len(predicted)}")
    counts = Counter(zip(gold, predicted, strict=True))
    return ConfusionTable(_label_order(set(gold) | set(predicted)), dict(counts))
