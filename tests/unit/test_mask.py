from __future__ import annotations

from pipeline.scoring.mask import SessionMaskState, decide_mask


def run(turns: list[tuple[float, bool]]) -> list[tuple[int, str | None, bool]]:
    state = SessionMaskState()
    out = []
    for score, has_next in turns:
        decision, state = decide_mask(score, has_next, state)
        out.append((decision.loss_mask, decision.exclude_reason, decision.promoted))
    return out


def test_scored_turns_with_next_state_are_included() -> None:
    assert run([(1.0, True), (-1.0, True)]) == [(1, None, False), (1, None, False)]


def test_no_next_state_is_always_excluded() -> None:
    assert run([(1.0, False)]) == [(0, "no_next_state", False)]
    assert run([(0.0, False), (0.0, True)]) == [(0, "no_next_state", False), (1, None, True)]


def test_first_judged_neutral_turn_is_promoted_once() -> None:
    assert run([(0.0, True), (0.0, True), (1.0, True)]) == [
        (1, None, True),
        (0, "neutral_score", False),
        (1, None, False),
    ]


def test_neutral_after_an_included_sample_is_excluded() -> None:
    assert run([(1.0, True), (0.0, True)]) == [(1, None, False), (0, "neutral_score", False)]
