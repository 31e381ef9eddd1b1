"""Human verdicts: a review from a sample, the token check, and reviews as a gold set.

A review on ``reviews`` (key = sample_id, compacted: the latest verdict on a sample is the
one that counts; an empty value withdraws it) becomes one line of the gold format
``turnstream judge agreement`` reads (:mod:`pipeline.rewards.agreement`): the judged
response and its next state, labelled with the reviewer's verdict.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from pipeline.errors import EventDecodeError
from pipeline.events import MAX_NOTE_CHARS, Review, Sample, decode_as

VERDICTS = (-1, 0, 1)


def build_review(sample: Sample, verdict: int, note: str | None, ts: float) -> Review:
    """A reviewer's verdict on ``sample``, carrying the turn it judges."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of -1, 0, 1, got {verdict!r}")
    note = (note or "").strip() or None
    if note is not None and len(note) > MAX_NOTE_CHARS:
        raise ValueError(f"note is {len(note)} characters; at most {MAX_NOTE_CHARS}")
    return Review(
        sample_id=sample.sample_id,
        session_id=sample.session_id,
        policy_version=sample.policy_version,
        verdict=verdict,  # type: ignore[arg-type]  # checked above
        note=note,
        judge_score=sample.score,
        messages=sample.messages,
        response=sample.response,
        next_state=sample.next_state,
        ts=ts,
    )


def token_ok(expected: str | None, given: str | None) -> bool:
    """Whether a request may review: no token configured, or the one given matches
    (compared in constant time)."""
    if expected is None:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def gold_line(review: Review) -> dict[str, Any]:
    """The review as a gold line: a reward input (the prompt with the judged response,
    the response, its next state) and the verdict as its ``label``."""
    response = review.response.model_dump(mode="json", exclude_none=True)
    assistant = {"role": "assistant", **response}
    assistant.pop("finish_reason", None)
    messages = [m.model_dump(mode="json", exclude_none=True) for m in review.messages]
    state = review.next_state
    return {
        "label": review.verdict,
        "agent_output": {"messages": [*messages, assistant]},
        "response": response,
        "next_state": None if state is None else state.model_dump(mode="json", exclude_none=True),
        "request_metadata": {
            "source": "reviews",
            "sample_id": review.sample_id,
            "session_id": review.session_id,
            "policy_version": review.policy_version,
            "judge_score": review.judge_score,
            "note": review.note,
        },
    }


def latest_reviews(records: Iterable[Any]) -> tuple[list[Review], list[str]]:
    """The latest review per sample_id from ``reviews`` records in offset order (a record
    without a value withdraws its key's review), and a problem per record that is no
    review (where it is)."""
    latest: dict[str, Review] = {}
    problems = []
    for record in records:
        key = record.key.decode("utf-8", "replace") if record.key else None
        if record.value is None:
            if key is not None:
                latest.pop(key, None)
            continue
        try:
            review = decode_as(Review, record.value)
        except EventDecodeError as exc:
            problems.append(f"{record.topic}/{record.partition}/{record.offset}: {exc}")
            continue
        latest.pop(review.sample_id, None)
        latest[review.sample_id] = review
    return list(latest.values()), problems
