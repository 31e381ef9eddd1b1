"""Gold items as training examples: the judge's prompt, and the answer it should give.

An eval example's answer is the score box alone, exactly what the worker
parses (``\\boxed{1}``, ``\\boxed{0}``, ``\\boxed{-1}``), then the end of the
turn: a vote costs the tokens it generates, and a reason written by a 135M
model adds tokens, not judgement (constrained decoding still allows one). A
hint example's answer is ``\\boxed{1}`` and the item's hint between
``[HINT_START]`` and ``[HINT_END]`` for an item that carries a hint, and
``\\boxed{-1}`` for an item whose next state shows nothing to improve (a
confirmation, a tool's success).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.errors import TurnstreamError
from pipeline.judge.prompts import eval_messages, hint_messages, render_content
from pipeline.rewards.agreement import GoldItem
from pipeline.rewards.types import response_text

Kind = Literal["eval", "hint"]


@dataclass(frozen=True)
class JudgeExample:
    """One prompt and its answer, as token ids (the answer ends with the end-of-turn token)."""

    kind: Kind
    label: int
    prompt_ids: list[int]
    answer_ids: list[int]
    line: int


def eval_answer(label: int) -> str:
    return f"\\boxed{{{label}}}"


def hint_answer(hint: str | None) -> str:
    return f"\\boxed{{1}} [HINT_START]{hint.strip()}[HINT_END]" if hint else "\\boxed{-1}"


def _label(item: GoldItem) -> int:
    if item.label not in (-1.0, 0.0, 1.0):
        raise TurnstreamError(
            f"gold line {item.line}: a judge label is -1, 0 or 1, not {item.label}"
        )
    return int(item.label)


def _pair(item: GoldItem) -> tuple[str, str, str]:
    """(assistant output, next-state role, next-state text) as the worker renders them."""
    state = item.input.next_state
    if state is None:
        raise TurnstreamError(f"gold line {item.line}: a judge example needs a next_state")
    return response_text(item.input), state.role, render_content(state.content)


def wants_hint_example(item: GoldItem) -> bool:
    """Hint examples: every item with a hint (+1 with it), and every other item (by line) that
    shows nothing to improve (-1): as many of each, and half the cost of all of them."""
    return item.hint is not None or (item.label > 0 and item.line % 2 == 1)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


def answer_ids(tokenizer: Any, text: str) -> list[int]:
    end = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    return [*tokenizer.encode(text, add_special_tokens=False), int(end)]


def build_examples(
    items: Iterable[GoldItem], tokenizer: Any, kinds: Sequence[Kind] = ("eval", "hint")
) -> list[JudgeExample]:
    """Eval examples for every item; hint examples for those :func:`wants_hint_example`."""
    out: list[JudgeExample] = []
    for item in items:
        label = _label(item)
        response, role, content = _pair(item)
        if "eval" in kinds:
            out.append(
                JudgeExample(
                    "eval",
                    label,
                    prompt_ids(tokenizer, eval_messages(response, role, content)),
                    answer_ids(tokenizer, eval_answer(label)),
                    item.line,
                )
            )
        if "hint" in kinds and wants_hint_example(item):
            out.append(
                JudgeExample(
                    "hint",
                    1 if item.hint else -1,
                    prompt_ids(tokenizer, hint_messages(response, role, content)),
                    answer_ids(tokenizer, hint_answer(item.hint)),
                    item.line,
                )
            )
    return out


def shared_prefix(sequences: Sequence[Sequence[int]]) -> int:
    """The length of the longest common prefix of ``sequences`` (the system prompt, mostly)."""
    if not sequences:
        return 0
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for seq in sequences[1:]:
        i = 0
        while i < length and seq[i] == first[i]:
            i += 1
        length = i
    return length
