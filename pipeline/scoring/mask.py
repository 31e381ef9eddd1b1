"""Loss masks: which scored turns the trainer learns from, and why not the others.

:func:`decide` is the one rule for every mode: rl by :func:`decide_mask`,
combine by :func:`decide_combine_mask`, opd by whether a hint was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.events import ExcludeReason

Mode = Literal["rl", "opd", "combine"]


@dataclass(frozen=True)
class MaskDecision:
    loss_mask: int
    exclude_reason: ExcludeReason | None
    promoted: bool  # included only by the at-least-one guarantee


def decide_mask(score: float, has_next_state: bool, first_judged: bool) -> MaskDecision:
    """The reference masking rules for one turn.

    Excluded: no next state, or a score of 0. Except the session's first judged
    turn (its first turn with a next state, so no sample of the session is
    included yet): a 0 there is still trained on (the at-least-one guarantee).
    The pairing stage, which sees a session's turns in order, sets
    ``first_judged``; that keeps this stage free of per-session state.
    """
    if not has_next_state:
        return MaskDecision(0, "no_next_state", False)
    if score == 0 and not first_judged:
        return MaskDecision(0, "neutral_score", False)
    return MaskDecision(1, None, promoted=score == 0)


def decide_combine_mask(score: float, has_next_state: bool, hint_accepted: bool) -> MaskDecision:
    """Combine mode: a turn trains when it has an eval score of ±1 or an accepted hint.

    As the reference's combine dispatch: both signals make one sample with both
    advantage terms; a hint with an eval score of 0 is an OPD-only sample
    (reward 0, teacher - old); ±1 without a hint is RL-only; neither is
    excluded. The at-least-one guarantee does not apply here (the reference's
    combine mode submits nothing for such a turn): promoted, a turn with score 0
    and no teacher would have advantage 0 on every token.
    """
    if not has_next_state:
        return MaskDecision(0, "no_next_state", False)
    if score == 0 and not hint_accepted:
        return MaskDecision(0, "neutral_score", False)
    return MaskDecision(1, None, False)


def decide(
    mode: Mode, score: float, has_next_state: bool, first_judged: bool, hint_accepted: bool
) -> tuple[int, ExcludeReason | None]:
    """(loss_mask, exclude_reason) of one judged turn in ``mode``.

    opd trains a turn exactly when a hint was accepted (its teacher signal);
    without a next state it is excluded as ``no_next_state``, else ``no_hint``.
    """
    if mode == "combine":
        decision = decide_combine_mask(score, has_next_state, hint_accepted)
    else:
        decision = decide_mask(score, has_next_state, first_judged)
    if mode == "opd":
        return (1, None) if hint_accepted else (0, decision.exclude_reason or "no_hint")
    return decision.loss_mask, decision.exclude_reason
