"""Ask the judge about one turn: m eval votes (fixed or early stop), or hint votes.

:class:`Judge` is what the scoring stage's PRM scorer
(:mod:`pipeline.scoring.scorers`) and the ``prm`` reward processor
(:mod:`pipeline.rewards.prm`) ask; :class:`HttpJudge` and
:class:`~pipeline.judge.rules.RulesJudge` answer it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol

from pipeline.events import JudgeIdentity
from pipeline.judge.client import JudgeClient
from pipeline.judge.prompts import (
    eval_messages,
    hint_messages,
)
from pipeline.judge.votes import (
    EvalResult,
    HintResult,
    hint_flaw,
    majority_vote,
    needs_third_vote,
    parse_hint,
    parse_score,
    select_hint,
)

VoteMode = Literal["fixed", "early_stop"]


class Judge(Protocol):
    identity: JudgeIdentity

    async def eval(self, response_text: str, next_role: str, next_content: str) -> EvalResult: ...

    async def hint(self, response_text: str, next_role: str, next_content: str) -> HintResult: ...


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
    """Ask m hint votes; the longest +1 hint over 10 characters without a :func:`hint_flaw`
    wins."""
    messages = hint_messages(response_text, next_role, next_content)
    start = time.monotonic()
    outputs = await client.complete(messages, m, hint=True)
    pairs = [(parse_score(t, allowed=(1, -1)), parse_hint(t)) for t in outputs]
    flaws = [hint_flaw(h.strip(), response_text) if v == 1 and h else None for v, h in pairs]
    kept = [(v, None if flaw else h) for (v, h), flaw in zip(pairs, flaws, strict=True)]
    return HintResult(
        select_hint(kept),
        [v for v, _ in pairs],
        len(outputs),
        time.monotonic() - start,
        tuple(f for f in flaws if f),
    )


@dataclass
class HttpJudge:
    """An SGLang or OpenAI-compatible judge behind a :class:`JudgeClient`."""

    client: JudgeClient
    identity: JudgeIdentity
    m: int = 3
    vote_mode: VoteMode = "fixed"
    hint_m: int = 1

    async def eval(self, response_text: str, next_role: str, next_content: str) -> EvalResult:
        return await eval_votes(
            self.client, response_text, next_role, next_content, self.m, self.vote_mode
        )

    async def hint(self, response_text: str, next_role: str, next_content: str) -> HintResult:
        return await hint_votes(self.client, response_text, next_role, next_content, self.hint_m)
