"""A scripted judge client: a test double that answers votes from a fixed sequence.

It stands in for :class:`~pipeline.judge.client.JudgeClient` where a
test or benchmark must know exactly which vote each call returns (the vote
runners ask for votes in batches, so a server answering concurrent requests
could not promise the order). A vote of None is an output without a valid box:
a failed vote.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def vote_text(vote: int | None) -> str:
    """A judge output that parses to ``vote`` (None: no valid box)."""
    if vote is None:
        return "The next state is unclear to me; no decision."
    return f"Weighing the next state as evidence.\n\\boxed{{{vote}}}"


class ScriptedJudgeClient:
    """Answers ``complete`` calls with the next votes of ``votes``, in order."""

    def __init__(self, votes: Sequence[int | None]) -> None:
        self.votes = list(votes)
        self.calls = 0

    async def complete(
        self, messages: list[dict[str, Any]], n: int, hint: bool = False
    ) -> list[str]:
        if self.calls + n > len(self.votes):
            raise IndexError(f"asked for vote {self.calls + n} of a script of {len(self.votes)}")
        out = [vote_text(v) for v in self.votes[self.calls : self.calls + n]]
        self.calls += n
        return out
