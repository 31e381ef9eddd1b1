"""Run the votes of one turn: fixed m concurrent votes, or early stop."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from pipeline.scoring.judge.client import JudgeClient
from pipeline.scoring.judge.parse import parse_hint, parse_score
from pipeline.scoring.judge.prompts import eval_messages, hint_messages
from pipeline.scoring.judge.vote import majority_vote, needs_third_vote, select_hint

VoteMode = Literal["fixed", "early_stop"]


@dataclass(frozen=True)
class EvalResult:
    score: float
    votes: list[int | None]
    judge_calls: int
    latency_s: float


@dataclass(frozen=True)
class HintResult:
    hint: str | None
    votes: list[int | None]
    judge_calls: int
    latency_s: float


async def eval_votes(
    client: JudgeClient,
    response_text: str,
    next_role: str,
    next_content: str,
    m: int = 3,
    vote_mode: VoteMode = "fixed",
) -> EvalResult:
    """Score one turn by majority over m votes (early stop: 2, then a 3rd if they differ)."""
    messages = eval_messages(response_text, next_role, next_content)
    start = time.monotonic()
    if vote_mode == "early_stop":
        if m != 3:
            raise ValueError(f"early_stop voting is defined for m=3, got m={m}")
        votes = [parse_score(t) for t in await client.complete(messages, 2)]
        if needs_third_vote(votes[0], votes[1]):
            votes += [parse_score(t) for t in await client.complete(messages, 1)]
    else:
        votes = [parse_score(t) for t in await client.complete(messages, m)]
    return EvalResult(majority_vote(votes), votes, len(votes), time.monotonic() - start)


async def hint_votes(
    client: JudgeClient, response_text: str, next_role: str, next_content: str, m: int = 1
) -> HintResult:
    """Ask m hint votes; the longest +1 hint over 10 characters wins."""
    messages = hint_messages(response_text, next_role, next_content)
    start = time.monotonic()
    outputs = await client.complete(messages, m, hint=True)
    pairs = [(parse_score(t, allowed=(1, -1)), parse_hint(t)) for t in outputs]
    return HintResult(
        select_hint(pairs), [v for v, _ in pairs], len(outputs), time.monotonic() - start
    )
