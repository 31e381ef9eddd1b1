"""The judge ("PRM"): prompts, output parsing and voting, as pure functions."""

from pipeline.scoring.judge.parse import parse_hint, parse_score
from pipeline.scoring.judge.vote import majority_vote, needs_third_vote, select_hint

__all__ = [
    "majority_vote",
    "needs_third_vote",
    "parse_hint",
    "parse_score",
    "select_hint",
]
