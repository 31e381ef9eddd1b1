"""Evaluation: how often the policy's answers to held-out prompts meet the preference.

Evaluation asks the policy server directly (not through the proxy), so its
answers are never captured and never train.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

import openai

from pipeline.learn.preference import RightAndShort, word_count
from pipeline.learn.prompts import Prompt
from pipeline.learn.users import Sampling, served_version


@dataclass(frozen=True)
class Answer:
    prompt_id: str
    words: int
    met: bool
    version: int | None
    stopped: bool  # it ended by itself, not at max_tokens


@dataclass(frozen=True)
class EvalResult:
    """The preference rate over ``n`` answers, and which policy versions gave them."""

    label: str
    n: int
    met: int
    mean_words: float
    versions: dict[str, int]

    @property
    def rate(self) -> float:
        return self.met / self.n if self.n else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "n": self.n,
            "met": self.met,
            "rate": round(self.rate, 4),
            "mean_words": round(self.mean_words, 2),
            "versions": self.versions,
        }


def summarize(label: str, answers: list[Answer]) -> EvalResult:
    """Rate, mean length and versions of a list of answers."""
    versions = Counter("unknown" if a.version is None else str(a.version) for a in answers)
    words = sum(a.words for a in answers)
    return EvalResult(
        label,
        len(answers),
        sum(a.met for a in answers),
        words / len(answers) if answers else 0.0,
        dict(sorted(versions.items())),
    )


async def _answers(
    url: str,
    prompts: list[Prompt],
    preference: RightAndShort,
    sampling: Sampling,
    samples_per_prompt: int,
    concurrency: int,
) -> list[Answer]:
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(
        base_url=url.rstrip("/") + "/v1", api_key="unused", timeout=300.0, max_retries=2
    ) as client:

        async def one(prompt: Prompt) -> Answer:
            async with gate:
                answer = await client.chat.completions.create(
                    model=sampling.model,
                    messages=[{"role": "user", "content": prompt.text}],
                    temperature=sampling.temperature,
                    max_tokens=sampling.max_tokens,
                )
            choice = answer.choices[0]
            met = preference.met(choice.message.content, choice.finish_reason, prompt)
            words = word_count(choice.message.content)
            stopped = choice.finish_reason == "stop"
            return Answer(prompt.id, words, met, served_version(answer), stopped)

        jobs = [one(p) for p in prompts for _ in range(samples_per_prompt)]
        return list(await asyncio.gather(*jobs))


def evaluate(
    label: str,
    url: str,
    prompts: list[Prompt],
    preference: RightAndShort,
    sampling: Sampling,
    samples_per_prompt: int = 1,
    concurrency: int = 16,
) -> EvalResult:
    """Ask each held-out prompt ``samples_per_prompt`` times; the share that met the preference."""
    answers = asyncio.run(
        _answers(url, prompts, preference, sampling, samples_per_prompt, concurrency)
    )
    return summarize(label, answers)
