"""The scoring stage's PRM judge as a reward processor.

:class:`PrmJudge` asks the configured judge (``TURNSTREAM_SCORING_JUDGE`` and
friends: SGLang, OpenAI-compatible, or the offline ``rules`` heuristic) for m
votes on the response, with the next state as evidence, and takes the majority,
exactly as ``turnstream worker`` does. An unreachable judge is FAILED (to be
retried), never a 0; an input without a next state scores 0, as in the worker.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import RewardError
from pipeline.judge.asking import Judge
from pipeline.judge.client import JudgeUnavailable
from pipeline.judge.factory import build_judge
from pipeline.judge.prompts import render_content
from pipeline.rewards.types import RewardInput, RewardOutput, response_text
from pipeline.settings import Settings, load_settings


def judge_from_settings(settings: Settings) -> Judge:
    """The eval judge ``turnstream worker`` would build from these settings."""
    rl_only = settings.model_copy(
        update={"scoring": settings.scoring.model_copy(update={"mode": "rl"})}
    )
    judge, _teacher = build_judge(rl_only)
    return judge


class PrmJudge:
    """Majority of m judge votes on (response, next state), as a RewardProcessor."""

    __reward_name__ = "prm"

    def __init__(self, judge: Judge | None = None, settings: Settings | None = None) -> None:
        self.judge = judge
        self._settings = settings

    def setup(self) -> None:
        if self.judge is None:
            self.judge = judge_from_settings(self._settings or load_settings())

    def describe(self) -> str:
        if self.judge is None:
            return "prm (not set up)"
        ident = self.judge.identity
        model = f", model {ident.model}" if ident.model else ""
        return f"prm: {ident.backend} judge{model}, prompt {ident.prompt_version}"

    async def close(self) -> None:
        client: Any = getattr(self.judge, "client", None)
        if client is not None:
            await client.close()

    async def process(self, input: RewardInput) -> RewardOutput:
        if self.judge is None:
            raise RewardError("PrmJudge.process before setup(): call setup() once first")
        if input.next_state is None:
            return RewardOutput.success(0.0, {"judge_calls": 0.0, "has_next_state": 0.0})
        try:
            ev = await self.judge.eval(
                response_text(input),
                input.next_state.role,
                render_content(input.next_state.content),
            )
        except JudgeUnavailable as exc:
            return RewardOutput.failed(str(exc))
        valid = sum(v is not None for v in ev.votes)
        return RewardOutput.success(
            ev.score,
            {
                "judge_calls": float(ev.judge_calls),
                "valid_votes": float(valid),
                "failed_votes": float(len(ev.votes) - valid),
                "has_next_state": 1.0,
            },
        )
