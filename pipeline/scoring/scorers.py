"""How the judging stage scores a pair: the PRM judge, with the votes the mode needs.

:func:`score_pair` asks what the mode needs (eval and hint votes at the same
time in combine mode), then the OPD teacher for an accepted hint, and builds
the sample (pipeline.scoring.samples).
"""

from __future__ import annotations

import asyncio
import time

from pipeline.events import Paired, Sample
from pipeline.judge.asking import Judge
from pipeline.judge.prompts import render_content, render_response
from pipeline.judge.teacher import Teacher
from pipeline.judge.votes import EvalResult, HintResult
from pipeline.scoring.mask import Mode
from pipeline.scoring.samples import build_sample


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
