"""OPD teacher log-probs: the judge scores the original response under a hinted prompt.

The teacher prompt is the turn's prompt with the selected hint appended to the
last user message (or to the last message if there is none), rendered with
the policy's chat template. The response tokens are exactly the ones the
trainer trains on (:func:`pipeline.turn_tokens.response_token_ids`, end-of-turn
token included). SGLang ``/generate`` then returns the log-prob of each
response token with ``max_new_tokens: 0`` and ``logprob_start_len`` = the
prompt length. With ``contrast`` the teacher is also asked with a neutral line
in the hint's place (:data:`NEUTRAL_HINT`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.events import Turn
from pipeline.judge.client import JudgeClient
from pipeline.turn_tokens import chat_dicts, render, response_token_ids

HINT_MARKER = "[user's hint / instruction]"
# What the contrastive teacher is asked with in the hint's place: a line that says nothing
# about the answer, so hinted - neutral is what the hint itself does, not what appending
# a marker and a line does to a small model's log-probs.
NEUTRAL_HINT = "Answer as you see fit."


@dataclass(frozen=True)
class TeacherOutput:
    """OPD teacher log-probs of a response's tokens under the hinted prompt."""

    logprobs: list[float]
    top_logprobs: list[list[tuple[float, int]]] | None  # per token: top-K (log-prob, id)
    neutral_logprobs: list[float] | None = None  # with NEUTRAL_HINT in the hint's place


def with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` with the hint appended to the last user message."""
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m.get("role") == "user"]
    target = out[users[-1] if users else -1]
    addition = f"\n\n{HINT_MARKER}\n{hint}"
    content = target.get("content")
    if isinstance(content, list):
        target["content"] = [*content, {"type": "text", "text": addition}]
    else:
        target["content"] = (content or "") + addition
    return out


class PolicyTokenizer:
    """The policy's tokenizer and chat template, from a local directory."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        self.path = path
        self.tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)

    def teacher_input(self, turn: Turn, hint: str) -> tuple[list[int], int]:
        """(input_ids of hinted prompt + response, number of response tokens)."""
        messages = chat_dicts(turn.messages)
        response_ids = response_token_ids(
            self.tok, messages, turn.response, turn.tools, turn.response_ids
        )
        text = render(self.tok, with_hint(messages, hint), turn.tools, add_generation_prompt=True)
        prompt_ids = self.tok.encode(text, add_special_tokens=False)
        return list(prompt_ids) + response_ids, len(response_ids)


class Teacher:
    """Teacher log-probs of a turn's response under its hinted prompt (SGLang).

    ``contrast``: also under the prompt with :data:`NEUTRAL_HINT` in the hint's place, asked
    at the same time; the trainer then trains on hinted - neutral.
    """

    def __init__(
        self,
        client: JudgeClient,
        tokenizer: PolicyTokenizer,
        top_k: int = 0,
        contrast: bool = False,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.top_k = top_k
        self.contrast = contrast

    async def logprobs(self, turn: Turn, hint: str) -> TeacherOutput:
        input_ids, response_len = self.tokenizer.teacher_input(turn, hint)
        if response_len == 0:
            return TeacherOutput([], [] if self.top_k else None, [] if self.contrast else None)
        asked = [self.client.teacher_logprobs(input_ids, response_len, self.top_k)]
        if self.contrast:
            neutral_ids, _ = self.tokenizer.teacher_input(turn, NEUTRAL_HINT)
            asked.append(self.client.teacher_logprobs(neutral_ids, response_len, 0))
        out, *neutral = await asyncio.gather(*asked)
        top = None
        if self.top_k:
            top = [[(float(e[0]), int(e[1])) for e in position] for position in out["top_logprobs"]]
        plain = [float(v) for v in neutral[0]["logprobs"]] if neutral else None
        return TeacherOutput(list(out["logprobs"]), top, plain)
