"""Evaluation on the held-out prompts, on measures from another source than the reward.

Per evaluated version: success (the answer is right, within max_words words,
and ended by itself: what the users thank), accuracy (right, at any length),
mean words, and the share of degenerate answers (empty, or one word that is
not the answer), so a policy that games the users' reply, say by answering in
one word, shows as one. Evaluation asks the policy server directly (not
through the proxy), so its answers are never captured and never train.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import openai

from pipeline.learn.preference import RightAndShort, word_count
from pipeline.learn.prompts import Prompt, is_correct
from pipeline.learn.users import Sampling, served_version
from pipeline.policy_records import HeldoutEvaluation


def is_degenerate(text: str | None, prompt: Prompt) -> bool:
    """Empty, or a single word that is not ``prompt``'s answer."""
    words = word_count(text)
    return words == 0 or (words == 1 and not is_correct(text, prompt))


@dataclass(frozen=True)
class Answer:
    prompt_id: str
    words: int
    met: bool  # success: right, short, ended by itself
    version: int | None
    stopped: bool  # it ended by itself, not at max_tokens
    correct: bool = False
    degenerate: bool = False


def measure_answer(
    prompt: Prompt,
    text: str | None,
    finish_reason: str | None,
    version: int | None,
    preference: RightAndShort,
) -> Answer:
    """One answer, measured: success by the preference, correctness, length, degeneracy."""
    return Answer(
        prompt.id,
        word_count(text),
        preference.met(text, finish_reason, prompt),
        version,
        finish_reason == "stop",
        is_correct(text, prompt),
        is_degenerate(text, prompt),
    )


@dataclass(frozen=True)
class EvalResult:
    """Success, accuracy, length and degenerate share over ``n`` answers, and which policy
    versions gave them."""

    label: str
    n: int
    met: int
    mean_words: float
    versions: dict[str, int]
    correct: int = 0
    degenerate: int = 0

    def _share(self, count: int) -> float:
        return count / self.n if self.n else 0.0

    @property
    def success(self) -> float:
        return self._share(self.met)

    @property
    def accuracy(self) -> float:
        return self._share(self.correct)

    @property
    def degenerate_share(self) -> float:
        return self._share(self.degenerate)

    def record(self, ts: float) -> HeldoutEvaluation | None:
        """This evaluation as a policy.versions record, when one version gave every answer
        (None: several versions, or a server that names none)."""
        [(version, count), *others] = self.versions.items() or [("", 0)]
        if others or not version.isdigit() or not self.n or count != self.n:
            return None
        return HeldoutEvaluation(
            version=int(version),
            ts=ts,
            n=self.n,
            heldout_accuracy=round(self.accuracy, 4),
            heldout_success=round(self.success, 4),
            mean_words=round(self.mean_words, 2),
            degenerate=round(self.degenerate_share, 4),
            label=self.label,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "n": self.n,
            "success": round(self.success, 4),
            "accuracy": round(self.accuracy, 4),
            "mean_words": round(self.mean_words, 2),
            "degenerate": round(self.degenerate_share, 4),
            "versions": self.versions,
        }


def summarize(label: str, answers: list[Answer]) -> EvalResult:
    """Success, accuracy, mean length, degenerate answers and versions of a list of answers."""
    versions = Counter("unknown" if a.version is None else str(a.version) for a in answers)
    words = sum(a.words for a in answers)
    return EvalResult(
        label,
        len(answers),
        sum(a.met for a in answers),
        words / len(answers) if answers else 0.0,
        dict(sorted(versions.items())),
        sum(a.correct for a in answers),
        sum(a.degenerate for a in answers),
    )


async def _answers(
    url: str,
    prompts: list[Prompt],
    preference: RightAndShort,
    sampling: Sampling,
    samples_per_prompt: int,
    concurrency: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[Answer]:
    gate = asyncio.Semaphore(concurrency)
    total, done = len(prompts) * samples_per_prompt, 0
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
            nonlocal done
            done += 1
            if progress is not None:
                progress(done, total)
            return measure_answer(
                prompt,
                choice.message.content,
                choice.finish_reason,
                served_version(answer),
                preference,
            )

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
    progress: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Ask each held-out prompt ``samples_per_prompt`` times; success, accuracy, length and
    degenerate share of the answers. ``progress(answered, total)`` hears of each answer."""
    answers = asyncio.run(
        _answers(url, prompts, preference, sampling, samples_per_prompt, concurrency, progress)
    )
    return summarize(label, answers)


class EvalProgress:
    """A line every ``every_s`` seconds while an evaluation runs: how many answers are in."""

    def __init__(
        self,
        label: str,
        say: Callable[[str], object],
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.say, self.every_s, self.clock = label, say, every_s, clock
        self.started = self.last = clock()

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if now - self.last >= self.every_s and done < total:
            self.last = now
            self.say(
                f"held-out ({self.label}): {done} of {total} answered, {now - self.started:.0f}s"
            )
