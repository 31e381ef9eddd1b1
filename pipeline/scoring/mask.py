"""Loss masks: which scored turns the trainer learns from, and why not the others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ExcludeReason = Literal["no_next_state", "neutral_score"]


@dataclass(frozen=True)
class SessionMaskState:
    """Per-session memory the at-least-one guarantee needs."""

    judged: int = 0  # turns with a next state that went through the judge
    included: int = 0  # samples with loss_mask 1


@dataclass(frozen=True)
class MaskDecision:
    loss_mask: int
    exclude_reason: ExcludeReason | None
    promoted: bool  # included only by the at-least-one guarantee


def decide_mask(
    score: float, has_next_state: bool, state: SessionMaskState
) -> tuple[MaskDecision, SessionMaskState]:
    """Apply the reference masking rules to one turn; return the decision and new state.

    Excluded: no next state, or a score of 0. Except the session's first judged
    turn while it has no included sample yet: a 0 there is still trained on.
    """
    if not has_next_state:
        return MaskDecision(0, "no_next_state", False), state
    first_judged = state.judged == 0 and state.included == 0
    judged = state.judged + 1
    if score == 0 and not first_judged:
        return MaskDecision(0, "neutral_score", False), SessionMaskState(judged, state.included)
    decision = MaskDecision(1, None, promoted=score == 0)
    return decision, SessionMaskState(judged, state.included + 1)
