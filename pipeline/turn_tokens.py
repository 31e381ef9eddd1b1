"""The token ids a turn trains on, as the policy's chat template renders them.

One function builds a response's ids for the trainer's batches and for the
OPD teacher's prompt, so rollout, teacher and trainer log-probs describe the
same tokens: what the template renders for the reply after the prompt
(``reasoning_content`` where the template renders it, text, tool calls) up
to and including the end-of-turn token, the tokenizer's eos. Ids the serving
engine returned win; the end-of-turn token is appended when they lack it,
unless the response was cut at its length limit (``finish_reason`` length).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import orjson
from prometheus_client import Counter

from pipeline.events import ChatMessage, Response

log = logging.getLogger(__name__)
PLAIN_TEXT = Counter(
    "turnstream_turn_tokens_plain_text_total",
    "responses tokenised as plain text, not as the chat template renders them (render_failed: "
    "the template raised; prompt_mismatch: its rendering did not extend the prompt's)",
    ["reason"],
)


def chat_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the plain dicts a chat template takes."""
    return [m.model_dump(exclude_none=True) for m in messages]


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    """The chat template's text for ``messages`` (with tool definitions when given)."""
    return str(
        tokenizer.apply_chat_template(
            messages,
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    )


def end_of_turn_id(tokenizer: Any) -> int | None:
    """The policy's end-of-turn token: its tokenizer's eos (None without a tokenizer)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if isinstance(eos, int) else None


def assistant_message(response: Response) -> dict[str, Any]:
    """The reply as a chat message; tool-call arguments parsed as the templates expect."""
    reply: dict[str, Any] = {"role": "assistant", "content": response.content or ""}
    if response.reasoning_content:
        reply["reasoning_content"] = response.reasoning_content
    if response.tool_calls:
        reply["tool_calls"] = [_parsed_arguments(c) for c in response.tool_calls]
    return reply


def prompt_token_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    own_ids: Sequence[int] | None = None,
) -> list[int]:
    """The prompt's ids: the serving engine's own, else the template's generation prompt."""
    if own_ids is not None:
        return list(own_ids)
    text = render(tokenizer, messages, tools, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def response_token_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    response: Response,
    tools: Sequence[dict[str, Any]] | None,
    own_ids: Sequence[int] | None = None,
) -> list[int]:
    """The response's ids, ending with the end-of-turn token.

    ``own_ids`` (what the serving engine generated) win, with the end-of-turn
    token appended when they lack it. Otherwise the template renders the
    conversation with the reply and the part after the generation prompt is
    tokenised, cut after its last end-of-turn token (what a template adds after
    it, such as ChatML's newline, is never generated).
    """
    eot = end_of_turn_id(tokenizer)
    ended = response.finish_reason != "length"  # a cut response never generated the token
    if own_ids is not None:
        ids = list(own_ids)
        if ended and eot is not None and (not ids or ids[-1] != eot):
            ids.append(eot)
        return ids
    prompt = render(tokenizer, messages, tools, add_generation_prompt=True)
    try:
        full = render(tokenizer, [*messages, assistant_message(response)], tools, False)
    except Exception as exc:  # a chat template is the model's code: any error, plain text
        full = ""
        _plain_text_fallback("render_failed", repr(exc))
    if full.startswith(prompt) and len(full) > len(prompt):
        ids = list(tokenizer.encode(full[len(prompt) :], add_special_tokens=False))
        if eot in ids:
            end = len(ids) - ids[::-1].index(eot)
            return ids[:end] if ended else ids[: end - 1]
    else:
        if full:
            _plain_text_fallback("prompt_mismatch", "its rendering does not extend the prompt's")
        ids = list(tokenizer.encode(_plain_text(response), add_special_tokens=False))
    return [*ids, eot] if ended and eot is not None else ids


def _plain_text_fallback(reason: str, why: str) -> None:
    PLAIN_TEXT.labels(reason).inc()
    log.warning(
        "the chat template could not render a reply after its prompt (%s); its tokens are the "
        "plain text's, not the template's: fix the template or send the serving engine's ids",
        why,
    )


def align_rollout(
    logprobs: Sequence[float] | None, response_ids: Sequence[int], eot: int | None
) -> list[float] | None:
    """Rollout log-probs position by position over ``response_ids``; NaN = none reported.

    One entry short with the last token the end-of-turn token (engines that
    report no log-prob for it): that position is NaN, so it gets no importance
    correction. Any other length does not describe these tokens: None.
    """
    if logprobs is None:
        return None
    n = len(response_ids)
    if len(logprobs) == n:
        return [float(v) for v in logprobs]
    if len(logprobs) == n - 1 and n and response_ids[-1] == eot:
        return [float(v) for v in logprobs] + [math.nan]
    return None


def _plain_text(response: Response) -> str:
    calls = "".join(
        f"{c.get('function', {}).get('name', '')}({c.get('function', {}).get('arguments', '')})"
        for c in response.tool_calls or []
    )
    return (response.content or "") + calls


def _parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """OpenAI sends arguments as a JSON string; HF chat templates expect a mapping."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = orjson.loads(args)
        except orjson.JSONDecodeError:
            return call
        if isinstance(parsed, dict):
            return {**call, "function": {**fn, "arguments": parsed}}
    return call
