"""The rules judge: a deterministic heuristic, the offline default when no judge URL is set."""

from __future__ import annotations

import re

from pipeline.events import JudgeIdentity
from pipeline.judge.votes import EvalResult, HintResult

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
