"""Read a vote (and a hint) out of the judge's own output text."""

from __future__ import annotations

import re

_BOX = re.compile(r"\\boxed\{([^{}]*)\}")
_SIGNED_DIGITS = re.compile(r"[+-]?\d+")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.DOTALL)


def parse_score(text: str, allowed: tuple[int, ...] = (-1, 0, 1)) -> int | None:
    """The vote in the last ``\\boxed{...}`` of ``text``; None is a failed vote.

    Only the last box counts, whatever came before it. Its content, stripped of
    spaces, must be a signed integer in ``allowed`` (``-0`` reads as 0);
    anything else (``2``, ``1.0``, ``yes``, no box at all) is a failed vote.
    Callers pass only the judge's output, never the judged conversation.
    """
    boxes = _BOX.findall(text)
    if not boxes:
        return None
    content = boxes[-1].strip()
    if not _SIGNED_DIGITS.fullmatch(content):
        return None
    value = int(content)
    return value if value in allowed else None


def parse_hint(text: str) -> str | None:
    """The last ``[HINT_START]…[HINT_END]`` block, stripped; None if absent or empty."""
    blocks = _HINT.findall(text)
    if not blocks:
        return None
    hint = blocks[-1].strip()
    return hint or None


_PREFERENCES = {"a": "first", "b": "second", "tie": "tie"}


def parse_preference(text: str) -> str | None:
    """A pairwise verdict from the last ``\\boxed{...}``: A -> ``first``, B -> ``second``,
    tie -> ``tie`` (any case, spaces ignored); anything else, or no box, is None."""
    boxes = _BOX.findall(text)
    if not boxes:
        return None
    return _PREFERENCES.get(boxes[-1].strip().lower())
