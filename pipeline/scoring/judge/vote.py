"""Majority voting, early-stop voting and OPD hint selection."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

MIN_HINT_CHARS = 10


def majority_vote(votes: Sequence[int | None]) -> float:
    """The mode of the valid votes; 0.0 when none is valid or the top count ties."""
    counts = Counter(v for v in votes if v is not None).most_common()
    if not counts:
        return 0.0
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return 0.0
    return float(counts[0][0])


def needs_third_vote(first: int | None, second: int | None) -> bool:
    """Early stop: two valid, equal votes already decide a majority of three."""
    return first is None or first != second


def select_hint(votes_with_hints: Sequence[tuple[int | None, str | None]]) -> str | None:
    """The longest hint over 10 characters among +1 votes; None means no OPD signal."""
    best: str | None = None
    for vote, hint in votes_with_hints:
        if vote != 1 or hint is None:
            continue
        hint = hint.strip()
        if len(hint) > MIN_HINT_CHARS and (best is None or len(hint) > len(best)):
            best = hint
    return best
