"""Votes as pure functions: read a vote (or hint, or preference) out of the judge's
own output, take the majority, decide early stop, pick the OPD hint."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

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


MIN_HINT_CHARS = 10
# beyond OpenClaw-RL's rule (a small judge's hints need it): a +1 hint that cannot teach
MAX_HINT_CHARS = 400  # the hint prompt asks for 1-3 sentences
ECHO_RUN = 7  # words in a row taken from the response that make a hint an echo of it
_WORD = re.compile(r"\w+")
_MARKERS = ("[hint_start]", "[hint_end]", "hint_start", "hint_end", "\\boxed")


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


def hint_flaw(hint: str, response_text: str) -> str | None:
    """Why a +1 hint cannot teach, or None.

    ``too_long``: over 400 characters (the prompt asks for 1-3 sentences). ``garbled``: the
    judge's own markers inside it. ``repeats``: a run of three words said three times or
    more. ``echoes_response``: 7 words or more in a row taken from the response; the
    teacher, shown the response in its hint, finds it likelier whatever it says, and OPD
    would reward repeating it (a correction restates a few words, then names what is
    right)."""
    lowered = hint.lower()
    if len(hint) > MAX_HINT_CHARS:
        return "too_long"
    if any(marker in lowered for marker in _MARKERS):
        return "garbled"
    words = _WORD.findall(lowered)
    runs = Counter(tuple(words[i : i + 3]) for i in range(len(words) - 2))
    if runs and max(runs.values()) >= 3:
        return "repeats"
    if longest_shared_run(words, _WORD.findall(response_text.lower())) >= ECHO_RUN:
        return "echoes_response"
    return None


def longest_shared_run(a: Sequence[str], b: Sequence[str]) -> int:
    """The most words in a row that ``a`` and ``b`` share."""
    return SequenceMatcher(None, a, b, autojunk=False).find_longest_match().size


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


@dataclass(frozen=True)
class EvalResult:
    """The eval votes of one turn and their majority."""

    score: float
    votes: list[int | None]
    judge_calls: int
    latency_s: float


@dataclass(frozen=True)
class HintResult:
    """The hint votes of one turn and the hint they selected (None: no OPD signal);
    ``rejected``: the :func:`hint_flaw` of each +1 hint screened out."""

    hint: str | None
    votes: list[int | None]
    judge_calls: int
    latency_s: float
    rejected: tuple[str, ...] = ()
