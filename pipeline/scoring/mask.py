"""Loss masks: which scored turns the trainer learns from, and why not the others."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.events import ExcludeReason


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
