"""Scored samples into padded tensors, in micro-batches grouped by length.

Log-probs are aligned to next-token positions: position ``t`` of a ``[B, L-1]``
tensor is the log-prob of token ``t+1``. A sample's response tokens sit at
positions ``P .. P+R-1`` of its ids, so their log-probs are at ``P-1 .. P+R-2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import torch

from pipeline.events import Sample


@dataclass(frozen=True)
class TokenizedSample:
    sample_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    rollout_logprobs: list[float] | None  # what the serving engine reported
    teacher_logprobs: list[float] | None
    policy_version: int | None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def _fit(values: list[float] | None, length: int) -> list[float] | None:
    """Truncate or zero-pad per-token values to ``length`` (None stays None)."""
    if values is None:
        return None
    return list(values[:length]) + [0.0] * max(0, length - len(values))


def sample_reward(sample: Sample, group_advantage: str = "none") -> float:
    """The reward a sample trains with: its score, or its advantage within its group.

    With a ``group_advantage`` method, a sample scored with its group
    (``group_scores``) gets ``group_advantages(group_scores, method)`` at its
    ``group_index``; a sample without a group keeps its score.
    """
    if group_advantage == "none" or sample.group_scores is None or sample.group_index is None:
        return sample.score
    from pipeline.rewards.group import group_advantages

    return group_advantages(sample.group_scores, group_advantage)[sample.group_index]  # type: ignore[arg-type]


def tokenize_sample(
    sample: Sample, tokenizer: Any, max_seq_len: int, group_advantage: str = "none"
) -> TokenizedSample:
    """Token ids of a sample: its own when it carries them, else the policy's chat template.

    Prompts longer than ``max_seq_len`` minus the response lose tokens on the left.
    The reward is :func:`sample_reward`.
    """
    messages = [m.model_dump(exclude_none=True) for m in sample.messages]
    prompt_text: str | None = None
    prompt_ids = sample.prompt_ids
    if prompt_ids is None:
        prompt_text = _render(tokenizer, messages, add_generation_prompt=True)
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    response_ids = sample.response_ids
    if response_ids is None:
        text = response_text(tokenizer, messages, sample, prompt_text)
        response_ids = tokenizer.encode(text, add_special_tokens=False)
    response_ids = list(response_ids)[: max(1, max_seq_len - 1)]
    room = max(1, max_seq_len - len(response_ids))
    prompt_ids = list(prompt_ids)[-room:]
    n = len(response_ids)
    return TokenizedSample(
        sample.sample_id,
        prompt_ids,
        response_ids,
        sample_reward(sample, group_advantage),
        _fit(sample.response_logprobs, n),
        _fit(sample.teacher_logprobs, n),
        sample.policy_version,
    )


def _render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    return str(
        tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    )


def response_text(
    tokenizer: Any, messages: list[dict[str, Any]], sample: Sample, prompt_text: str | None
) -> str:
    """The text whose tokens are the response.

    A text-only response is its content, as before (rollout and teacher log-probs are
    taken over those tokens). A response with tool calls is what the chat template
    renders after the prompt, so a turn that only calls tools still has tokens to train.
    """
    if not sample.response.tool_calls:
        return sample.response.content or ""
    calls = [_parsed_arguments(c) for c in sample.response.tool_calls]
    reply: dict[str, Any] = {
        "role": "assistant",
        "content": sample.response.content or "",
        "tool_calls": calls,
    }
    prompt_text = prompt_text or _render(tokenizer, messages, add_generation_prompt=True)
    try:
        full = _render(tokenizer, [*messages, reply], add_generation_prompt=False)
    except Exception:  # a template that cannot render this reply: fall back to plain text
        full = ""
    if full.startswith(prompt_text) and len(full) > len(prompt_text):
        return full[len(prompt_text) :]
    rendered = "".join(
        f"{c.get('function', {}).get('name', '')}({c.get('function', {}).get('arguments', '')})"
        for c in sample.response.tool_calls
    )
    return (sample.response.content or "") + rendered


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


@dataclass
class MicroBatch:
    sample_ids: list[str]
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, L-1] float: 1 at response-token log-prob positions
    rollout_logprobs: torch.Tensor  # [B, L-1], 0 where unknown
    has_rollout: torch.Tensor  # [B] bool
    teacher_logprobs: torch.Tensor  # [B, L-1], 0 where unknown
    has_teacher: torch.Tensor  # [B] bool
    rewards: torch.Tensor  # [B]

    @property
    def tokens(self) -> int:
        return int(self.response_mask.sum().item())


def collate(samples: Sequence[TokenizedSample], pad_id: int) -> MicroBatch:
    width = max(s.length for s in samples)
    b = len(samples)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    response_mask = torch.zeros((b, width - 1))
    rollout = torch.zeros((b, width - 1))
    teacher = torch.zeros((b, width - 1))
    for i, s in enumerate(samples):
        ids = s.prompt_ids + s.response_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        start, end = len(s.prompt_ids) - 1, len(ids) - 1
        response_mask[i, start:end] = 1.0
        if s.rollout_logprobs is not None:
            rollout[i, start:end] = torch.tensor(s.rollout_logprobs)
        if s.teacher_logprobs is not None:
            teacher[i, start:end] = torch.tensor(s.teacher_logprobs)
    return MicroBatch(
        [s.sample_id for s in samples],
        input_ids,
        attention,
        response_mask,
        rollout,
        torch.tensor([s.rollout_logprobs is not None for s in samples]),
        teacher,
        torch.tensor([s.teacher_logprobs is not None for s in samples]),
        torch.tensor([s.reward for s in samples], dtype=torch.float32),
    )


def micro_batches(
    samples: Sequence[TokenizedSample], size: int, pad_id: int, bucketing: bool = True
) -> list[MicroBatch]:
    """Split a step's samples into micro-batches; with bucketing, similar lengths together."""
    ordered = sorted(samples, key=lambda s: s.length) if bucketing else list(samples)
    return [collate(ordered[i : i + size], pad_id) for i in range(0, len(ordered), size)]


def padding_fraction(batches: Sequence[MicroBatch]) -> float:
    """Share of the token slots in the batches that are padding."""
    slots = sum(mb.attention_mask.numel() for mb in batches)
    real = sum(int(mb.attention_mask.sum().item()) for mb in batches)
    return 1.0 - real / slots if slots else 0.0
