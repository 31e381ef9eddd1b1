"""One sample's panel: prompt, response (OPD: coloured by teacher − rollout per token), next
state, votes, hint, loss mask, raw JSON and the review form (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any
from urllib.parse import quote

import orjson

from pipeline.console.index import teacher_gaps
from pipeline.console.svg import number
from pipeline.events import Content, Review, Sample

MIN_SCALE = 0.5  # nats: the advantage at which a token's colour is full, at least


@dataclass(frozen=True)
class ReviewForm:
    """Whether the review form is shown, and whether it asks for the token."""

    enabled: bool
    needs_token: bool
    back: str  # the page to come back to after a verdict


def content_text(content: Content) -> str:
    """A message's content as text: its text parts joined, anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
        return "\n".join(str(t) for t in texts)
    return orjson.dumps(content, option=orjson.OPT_INDENT_2).decode()


def _pretty(data: Any) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


def advantage_colour(advantage: float, scale: float) -> str:
    """Green for a token the teacher likes more than the rollout did, red for less."""
    alpha = min(1.0, abs(advantage) / scale) * 0.6
    rgb = "46,160,67" if advantage >= 0 else "218,54,51"
    return f"rgba({rgb},{alpha:.2f})"


def coloured_tokens(sample: Sample, pieces: Sequence[str] | None) -> str | None:
    """The response's tokens, each coloured by its teacher − rollout log-prob, with the
    value as a tooltip; None when the sample has no per-token teacher signal. ``pieces``:
    each token's text (without a tokenizer, the token ids stand in)."""
    gaps = teacher_gaps(sample)
    if gaps is None:
        return None
    ids = sample.response_ids or []
    if pieces is None or len(pieces) != len(gaps):
        pieces = [f"[{ids[i]}]" if i < len(ids) else f"[{i}]" for i in range(len(gaps))]
    scale = max(MIN_SCALE, *(abs(g) for g in gaps))
    spans = "".join(
        f'<span class="tok" style="background:{advantage_colour(g, scale)}" '
        f'title="teacher − rollout: {g:+.3f}">{escape(piece)}</span>'
        for piece, g in zip(pieces, gaps, strict=True)
    )
    mean = sum(gaps) / len(gaps)
    return (
        f'<p class="legend">per-token teacher − rollout log-prob (mean {mean:+.3f}; full colour '
        f"at ±{number(scale)}): green the teacher likes the token more</p>"
        f'<div id="advantage" class="tokens">{spans}</div>'
    )


def _message(role: str, text: str, extra: str = "") -> str:
    return (
        f'<div class="msg role-{escape(role)}"><span class="role">{escape(role)}</span>'
        f"<pre>{escape(text)}</pre>{extra}</div>"
    )


def _tool_calls(calls: list[dict[str, Any]] | None) -> str:
    return f'<pre class="tool-calls">{escape(_pretty(calls))}</pre>' if calls else ""


def _facts(sample: Sample, session_link: str) -> str:
    mask = "1 (trains)" if sample.loss_mask else f"0 (excluded: {sample.exclude_reason})"
    judge = sample.judge.backend + (f" {sample.judge.model}" if sample.judge.model else "")
    facts = [
        (
            "session",
            f'<a id="session-link" href="{escape(session_link)}">{escape(sample.session_id)}</a>',
        ),
        ("turn", str(sample.turn_index)),
        ("policy version", "none" if sample.policy_version is None else str(sample.policy_version)),
        ("mode", sample.mode),
        ("score", f"{sample.score:+g}"),
        ("loss mask", f'<span id="loss-mask">{escape(mask)}</span>'),
        (
            "judge",
            escape(f"{judge} (prompt {sample.judge.prompt_version}, {sample.judge_calls} call(s))"),
        ),
    ]
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"


def _votes(votes: list[int | None]) -> str:
    items = "".join(
        f'<li class="vote">vote {i}: {"failed (no valid score)" if v is None else f"{v:+d}"}</li>'
        for i, v in enumerate(votes, start=1)
    )
    return f'<ul id="votes">{items or "<li>no votes</li>"}</ul>'


def review_panel(sample: Sample, review: Review | None, form: ReviewForm) -> str:
    done = (
        f'<p id="verdict">reviewed: <b>{review.verdict:+d}</b>'
        f"{' — ' + escape(review.note) if review.note else ''}</p>"
        if review
        else '<p id="verdict">not reviewed yet</p>'
    )
    if not form.enabled:
        return done + (
            '<p class="readonly">This console is read-only: start it with --reviews '
            "(and TURNSTREAM_CONSOLE_TOKEN) to record verdicts.</p>"
        )
    token = (
        '<input type="password" name="token" placeholder="console token" '
        'autocomplete="current-password" required> '
        if form.needs_token
        else ""
    )
    buttons = "".join(
        f'<button type="submit" name="verdict" value="{v}" id="verdict-{name}">{label}</button> '
        for v, name, label in (
            (1, "good", "+1 good"),
            (0, "unsure", "0 unsure"),
            (-1, "bad", "−1 bad"),
        )
    )
    return done + (
        '<form id="review-form" method="post" action="/review">'
        f'<input type="hidden" name="sample_id" value="{escape(sample.sample_id)}">'
        f'<input type="hidden" name="back" value="{escape(form.back)}">'
        '<textarea name="note" maxlength="2000" placeholder="note (optional)"></textarea><br>'
        f"{token}{buttons}</form>"
    )


def sample_panel(
    sample: Sample,
    review: Review | None,
    form: ReviewForm,
    session_link: str,
    pieces: Sequence[str] | None = None,
) -> str:
    """The whole panel of one sample."""
    prompt = "".join(
        _message(m.role, content_text(m.content), _tool_calls(m.tool_calls))
        for m in sample.messages
    )
    response = coloured_tokens(sample, pieces) or ""
    response += _message(
        "assistant", sample.response.content or "", _tool_calls(sample.response.tool_calls)
    )
    state = sample.next_state
    next_state = _message(state.role, content_text(state.content)) if state else "<p>none</p>"
    hint = escape(sample.hint) if sample.hint else "none"
    raw = escape(_pretty(sample.model_dump(mode="json")))
    return (
        f'<article id="sample-detail" data-sample-id="{escape(sample.sample_id)}">'
        f"<h2>sample {escape(sample.sample_id)}</h2>{_facts(sample, session_link)}"
        f"<h3>votes</h3>{_votes(sample.votes)}"
        f'<h3>hint</h3><p id="hint">{hint}</p>'
        f'<h3>prompt</h3><div id="prompt">{prompt}</div>'
        f'<h3>response</h3><div id="response">{response}</div>'
        f'<h3>next state</h3><div id="next-state">{next_state}</div>'
        f'<h3>review</h3><div id="review">{review_panel(sample, review, form)}</div>'
        f'<details id="raw"><summary>raw JSON</summary><pre>{raw}</pre>'
        f'<a href="/api/sample/{quote(sample.sample_id, safe="")}">as a file</a>'
        "</details></article>"
    )
