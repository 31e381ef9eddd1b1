from __future__ import annotations

import pytest

from pipeline.scoring.mask import decide_combine_mask, decide_mask


@pytest.mark.parametrize(
    ("score", "has_next", "first", "expected"),
    [
        (1.0, True, False, (1, None, False)),
        (-1.0, True, False, (1, None, False)),
        (-1.0, True, True, (1, None, False)),
        (0.0, True, False, (0, "neutral_score", False)),
        (0.0, True, True, (1, None, True)),  # at-least-one guarantee
        (1.0, False, False, (0, "no_next_state", False)),
        (0.0, False, True, (0, "no_next_state", False)),  # never promoted without evidence
    ],
)
def test_decide_mask(score: float, has_next: bool, first: bool, expected: tuple) -> None:
    d = decide_mask(score, has_next, first)
    assert (d.loss_mask, d.exclude_reason, d.promoted) == expected


@pytest.mark.parametrize(
    ("score", "has_next", "hint", "expected"),
    [
        (1.0, True, True, (1, None)),  # both signals: one combined sample
        (-1.0, True, False, (1, None)),  # RL only
        (0.0, True, True, (1, None)),  # OPD only: reward 0, teacher - old
        (0.0, True, False, (0, "neutral_score")),  # neither (even a session's first)
        (1.0, False, False, (0, "no_next_state")),
    ],
)
def test_decide_combine_mask(score: float, has_next: bool, hint: bool, expected: tuple) -> None:
    d = decide_combine_mask(score, has_next, hint)
    assert (d.loss_mask, d.exclude_reason, d.promoted) == (*expected, False)
