"""A judged pair becomes a scored sample: votes, teacher signal, loss mask (pure)."""

from __future__ import annotations

from pipeline.events import JudgeIdentity, Paired, Sample
from pipeline.judge.teacher import TeacherOutput
from pipeline.judge.votes import EvalResult, HintResult
from pipeline.scoring.mask import Mode, decide


def build_sample(
    paired: Paired,
    identity: JudgeIdentity,
    mode: Mode,
    ev: EvalResult | None,
    hi: HintResult | None,
    judge_s: float,
    teacher: TeacherOutput | None = None,
) -> Sample:
    """The scored sample of a pair, with votes, mask and reason (:func:`mask.decide`)."""
    turn = paired.turn
    score = ev.score if ev else 0.0
    hinted = hi is not None and hi.hint is not None
    mask, reason = decide(mode, score, paired.next_state is not None, paired.first_judged, hinted)
    if reason == "no_hint" and hi is not None and hi.rejected:
        reason = "hint_rejected"  # +1 hints came, each with a flaw (votes.hint_flaw)
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
        teacher_neutral_logprobs=teacher.neutral_logprobs if teacher else None,
        policy_version=turn.policy_version,
        group_id=turn.group_id,
        judge=identity,
        timings=timings,
    )
