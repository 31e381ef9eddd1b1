"""Judge one paired turn and build its scored sample (the judge + mask stages)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Literal, Protocol

from pipeline.events import ExcludeReason, JudgeIdentity, Paired, Sample
from pipeline.scoring.judge.client import JudgeClient
from pipeline.scoring.judge.prompts import PROMPT_VERSION, render_content, render_response
from pipeline.scoring.judge.voting import (
    EvalResult,
    HintResult,
    VoteMode,
    eval_votes,
    hint_votes,
)
from pipeline.scoring.mask import decide_combine_mask, decide_mask
from pipeline.scoring.teacher import Teacher, TeacherOutput

Mode = Literal["rl", "opd", "combine"]


class Judge(Protocol):
    identity: JudgeIdentity

    async def eval(self, response_text: str, next_role: str, next_content: str) -> EvalResult: ...

    async def hint(self, response_text: str, next_role: str, next_content: str) -> HintResult: ...


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


_TOOL_ERROR = re.compile(
    r"\b(error|exception|traceback|failed|failure|not found|denied|refused|timeout|"
    r"timed out|invalid|cannot|can't|unable)\b|\bHTTP [45]\d\d\b|command not found",
    re.IGNORECASE,
)
_REDO = re.compile(
    r"\b(wrong|incorrect|not what|redo|again|rephrase|i meant|that's not|that is not|"
    r"fix (it|your)|try again|no,)",
    re.IGNORECASE,
)
_PROGRESS = re.compile(
    r"\b(thanks|thank you|perfect|great|exactly|works|next question|nice|awesome)\b", re.IGNORECASE
)


class RulesJudge:
    """A deterministic heuristic judge: the offline default when no judge URL is set.

    Tool output: an error-looking result is -1, anything else +1. User reply:
    a correction or redo request is -1, thanks or moving on +1, else 0. It is
    no model; samples record ``backend: rules``.
    """

    identity = JudgeIdentity(backend="rules", model="heuristic", prompt_version="rules-v1")

    @staticmethod
    def vote(next_role: str, next_content: str) -> int:
        if next_role == "tool":
            return -1 if _TOOL_ERROR.search(next_content) else 1
        if _REDO.search(next_content):
            return -1
        return 1 if _PROGRESS.search(next_content) else 0

    async def eval(self, response_text: str, next_role: str, next_content: str) -> EvalResult:
        vote = self.vote(next_role, next_content)
        return EvalResult(float(vote), [vote], 1, 0.0)

    async def hint(self, response_text: str, next_role: str, next_content: str) -> HintResult:
        if self.vote(next_role, next_content) == -1 and next_role == "user":
            return HintResult(
                f"The user said afterwards: {next_content.strip()[:300]}", [1], 1, 0.0
            )
        return HintResult(None, [-1], 1, 0.0)


def judge_identity(
    backend: Literal["rules", "sglang", "openai"], model: str | None, urls: list[str]
) -> JudgeIdentity:
    return JudgeIdentity(backend=backend, model=model, prompt_version=PROMPT_VERSION, urls=urls)


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


def _mask(
    paired: Paired, mode: Mode, score: float, hinted: bool
) -> tuple[int, ExcludeReason | None]:
    has_next = paired.next_state is not None
    if mode == "combine":
        decision = decide_combine_mask(score, has_next, hinted)
    else:
        decision = decide_mask(score, has_next, paired.first_judged)
    if mode == "opd":
        return (1, None) if hinted else (0, decision.exclude_reason or "no_hint")
    return decision.loss_mask, decision.exclude_reason


def build_sample(
    paired: Paired,
    identity: JudgeIdentity,
    mode: Mode,
    ev: EvalResult | None,
    hi: HintResult | None,
    judge_s: float,
    teacher: TeacherOutput | None = None,
) -> Sample:
    """The scored sample of a pair, with votes, mask and reason.

    rl: :func:`decide_mask`; opd: trained when a hint was accepted; combine:
    :func:`decide_combine_mask` (an accepted hint with an eval score of 0 is an
    OPD-only sample).
    """
    turn = paired.turn
    score = ev.score if ev else 0.0
    mask, reason = _mask(paired, mode, score, hi is not None and hi.hint is not None)
    votes = (ev.votes if ev else []) + (hi.votes if hi and mode == "opd" else [])
    calls = (ev.judge_calls if ev else 0) + (hi.judge_calls if hi else 0)
    timings = {"judge_s": round(judge_s, 6)}
    if hi is not None:
        timings["hint_s"] = round(hi.latency_s, 6)
    return Sample(
        sample_id=paired.sample_id,
        session_id=turn.session_id,
        turn_index=turn.turn_index,
        messages=list(turn.messages),
        response=turn.response,
        tools=turn.tools,
        next_state=paired.next_state,
        prompt_ids=turn.prompt_ids,
        response_ids=turn.response_ids,
        response_logprobs=turn.response_logprobs,
        score=score,
        votes=votes,
        judge_calls=calls,
        exclude_reason=reason,
        loss_mask=mask,
        mode=mode,
        hint=hi.hint if hi else None,
        teacher_logprobs=teacher.logprobs if teacher else None,
        teacher_top_logprobs=teacher.top_logprobs if teacher else None,
        policy_version=turn.policy_version,
        group_id=turn.group_id,
        judge=identity,
        timings=timings,
    )
