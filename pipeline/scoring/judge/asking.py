"""Ask the judge about one pair: m eval votes (fixed or early stop), hint votes, the teacher.

:func:`score_pair` is the judging stage's one call: it asks what the mode
needs (eval and hint votes at the same time in combine mode), then the OPD
teacher for an accepted hint, and builds the sample (pipeline.scoring.samples).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal, Protocol

from pipeline.events import JudgeIdentity, Paired, Sample
from pipeline.scoring.judge.client import JudgeClient
from pipeline.scoring.judge.prompts import (
    eval_messages,
    hint_messages,
    render_content,
    render_response,
)
from pipeline.scoring.judge.teacher import Teacher
from pipeline.scoring.mask import Mode
from pipeline.scoring.samples import build_sample
from pipeline.scoring.votes import (
    EvalResult,
    HintResult,
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
    """Ask m hint votes; the longest +1 hint over 10 characters wins."""
    messages = hint_messages(response_text, next_role, next_content)
    start = time.monotonic()
    outputs = await client.complete(messages, m, hint=True)
    pairs = [(parse_score(t, allowed=(1, -1)), parse_hint(t)) for t in outputs]
    return HintResult(
        select_hint(pairs), [v for v, _ in pairs], len(outputs), time.monotonic() - start
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


async def score_pair(
    paired: Paired, judge: Judge, mode: Mode, teacher: Teacher | None = None
) -> Sample:
    """Judge a pair (no call when it has no next state) and attach its loss mask.

    Raises JudgeUnavailable when the judge cannot be reached: the caller sends
    the pair to the retry topic; it never becomes a score.
    """
    turn, next_state = paired.turn, paired.next_state
    started = time.monotonic()
    ev: EvalResult | None = None
    hi: HintResult | None = None
    if next_state is not None:
        args = (
            render_response(turn.response.content, turn.response.tool_calls),
            next_state.role,
            render_content(next_state.content),
        )
        if mode == "combine":  # eval and hint votes at the same time
            ev, hi = await asyncio.gather(judge.eval(*args), judge.hint(*args))
        elif mode == "rl":
            ev = await judge.eval(*args)
        else:
            hi = await judge.hint(*args)
    judge_s = time.monotonic() - started
    teacher_out = None
    if hi is not None and hi.hint and teacher is not None:
        teacher_out = await teacher.logprobs(turn, hi.hint)
    return build_sample(paired, judge.identity, mode, ev, hi, judge_s, teacher_out)
