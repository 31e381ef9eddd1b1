"""A pairwise LLM judge, and a group reward built on it.

:class:`PairwiseJudge` asks the configured HTTP judge (SGLang or an
OpenAI-compatible server, ``TURNSTREAM_SCORING_JUDGE*``) which of two outputs
is better, with the conversation as context, and reads ``\\boxed{A}``,
``\\boxed{B}`` or ``\\boxed{tie}`` from the judge's own output. A judge prefers
whichever answer it reads first more often than it should, so
:meth:`PairwiseJudge.prefer` asks both orders and keeps only a verdict that
survives the swap (:func:`consistent_verdict`); an answer without a readable box
counts as no verdict.

:class:`PairwiseGroupReward` is a group processor: it compares every pair of a
group's outputs that way and scores each output by its win rate over the
comparisons that gave a consistent verdict (a tie is half a win); an output
with none scores 0.5. An unreachable judge makes the group FAILED (retried),
never a score.

```yaml
group:
  classpath: pipeline.rewards.pairwise:PairwiseGroupReward
  size: 4
```
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from pipeline.errors import ConfigError, RewardError
from pipeline.judge.client import JudgeClient, JudgeUnavailable
from pipeline.judge.factory import judge_client
from pipeline.judge.prompts import pairwise_messages, render_content, render_response
from pipeline.judge.votes import parse_preference
from pipeline.rewards import metrics
from pipeline.rewards.quality import PairwiseOutcome, Verdict, consistent_verdict
from pipeline.rewards.types import (
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    TaskStatus,
)
from pipeline.settings import Settings, load_settings


class NoVerdict(Exception):
    """The judge answered, but not with A, B or tie."""


class PairwiseJudge:
    """One question to the judge: which of two outputs is better, in the order shown."""

    def __init__(self, client: JudgeClient) -> None:
        self.client = client
        self.calls = 0
        self.unreadable = 0

    async def compare(self, context: str, first: str, second: str) -> Verdict:
        self.calls += 1
        [text] = await self.client.complete(pairwise_messages(context, first, second), n=1)
        verdict = parse_preference(text)
        if verdict is None:
            self.unreadable += 1
            raise NoVerdict(text[-200:])
        return verdict  # type: ignore[return-value]

    async def prefer(self, context: str, a: str, b: str) -> PairwiseOutcome:
        """``a``, ``b``, ``tie``, or ``inconsistent`` (the verdict changed with the order,
        or an answer had no verdict). Raises JudgeUnavailable when the judge is down."""

        async def ask(first: str, second: str) -> Verdict | None:
            try:
                return await self.compare(context, first, second)
            except NoVerdict:
                return None

        ab, ba = await asyncio.gather(ask(a, b), ask(b, a))
        outcome: PairwiseOutcome = (
            "inconsistent" if ab is None or ba is None else consistent_verdict(ab, ba)
        )
        metrics.PAIRWISE.labels(outcome).inc()
        return outcome


def client_from_settings(settings: Settings) -> JudgeClient:
    """The HTTP judge client ``turnstream worker`` would build from these settings."""
    if settings.scoring.judge == "rules":
        raise ConfigError(
            f"a pairwise judge needs an HTTP judge (TURNSTREAM_SCORING_JUDGE=sglang or openai); "
            f"it is {settings.scoring.judge!r}"
        )
    return judge_client(settings)


def _context(input: GroupRewardInput) -> str:
    """The conversation before the outputs: the first output's messages up to its answer."""
    messages = input.agent_outputs[0].messages
    prompt = messages[:-1] if messages and messages[-1].get("role") == "assistant" else messages
    return "\n".join(f"[{m.get('role', '?')}] {render_content(m.get('content'))}" for m in prompt)


def _answer(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "assistant":
            content = render_content(message.get("content")) or None
            return render_response(content, message.get("tool_calls"))
    return "(empty output)"


class PairwiseGroupReward:
    """Each output's win rate against the others of its group, order-checked."""

    __reward_name__ = "pairwise"

    def __init__(self, judge: PairwiseJudge | None = None, settings: Settings | None = None):
        self.judge = judge
        self._settings = settings

    def setup(self) -> None:
        if self.judge is None:
            self.judge = PairwiseJudge(client_from_settings(self._settings or load_settings()))

    async def close(self) -> None:
        if self.judge is not None:
            await self.judge.client.close()

    async def process(self, input: GroupRewardInput) -> GroupRewardOutput:
        if self.judge is None:
            raise RewardError("PairwiseGroupReward.process before setup(): call setup() once")
        judge = self.judge
        context = _context(input)
        answers = [_answer(o.messages) for o in input.agent_outputs]
        pairs = list(itertools.combinations(range(len(answers)), 2))
        try:
            outcomes = await asyncio.gather(
                *(judge.prefer(context, answers[i], answers[j]) for i, j in pairs)
            )
        except JudgeUnavailable as exc:
            return GroupRewardOutput(status=TaskStatus.FAILED, error=str(exc))
        n = len(answers)
        wins, losses, ties, unsure = [0] * n, [0] * n, [0] * n, [0] * n
        for (i, j), outcome in zip(pairs, outcomes, strict=True):
            if outcome == "a":
                wins[i], losses[j] = wins[i] + 1, losses[j] + 1
            elif outcome == "b":
                wins[j], losses[i] = wins[j] + 1, losses[i] + 1
            elif outcome == "tie":
                ties[i], ties[j] = ties[i] + 1, ties[j] + 1
            else:
                unsure[i], unsure[j] = unsure[i] + 1, unsure[j] + 1
        rewards = []
        for k in range(n):
            decided = wins[k] + losses[k] + ties[k]
            score = (wins[k] + 0.5 * ties[k]) / decided if decided else 0.5
            rewards.append(
                Reward(
                    reward_score=score,
                    reward_metrics={
                        "wins": float(wins[k]),
                        "losses": float(losses[k]),
                        "ties": float(ties[k]),
                        "inconsistent": float(unsure[k]),
                        "judge_calls": 2.0 * (n - 1),
                    },
                )
            )
        return GroupRewardOutput(reward=GroupReward(rewards=rewards), status=TaskStatus.SUCCESS)
