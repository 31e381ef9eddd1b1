"""What the simulated users prefer, and what they say about an answer: the pure part.

The users want the right answer, briefly: a right answer that ends by itself
within ``max_words`` words gets thanks; a wrong one gets a correction that
states the right answer (the hindsight an on-policy distillation hint needs);
a right one that runs long, or is cut off, gets a request to be shorter. Each
kind has several phrasings, chosen by the user's seeded rng, all worded so the
rules judge scores thanks +1 and the other two -1 (never 0, which would
exclude the sample); an LLM judge reads them the same way.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

from pipeline.learn.prompts import Prompt, is_correct

WORD = re.compile(r"\S+")

Verdict = Literal["right", "wrong", "long"]

THANKS = (
    "Thanks, perfect!",
    "Great, thank you!",
    "Perfect, exactly what I needed.",
    "Nice, thanks!",
    "Thank you, that's it.",
    "Awesome, thanks a lot.",
)
CORRECTIONS = (
    "No, that's wrong: it's {answer}.",
    "That's not right. The answer is {answer}.",
    "Incorrect, it is {answer}.",
    "No, the right answer is {answer}.",
    "Wrong, it's {answer}.",
    "That is not correct: the answer is {answer}.",
)
SHORTER = (
    "No, too long. Try again, shorter please.",
    "Right, but too long. Say it again in a few words.",
    "Correct, but can you redo that in {max_words} words or fewer?",
    "Yes, but that's too wordy: try again, shorter.",
    "Please rephrase that in fewer words.",
    "That's right but long; answer again in a word or two.",
)


def word_count(text: str | None) -> int:
    return len(WORD.findall(text or ""))


@dataclass(frozen=True)
class RightAndShort:
    """Users who want the right answer in at most ``max_words`` words, ended by itself."""

    max_words: int = 15

    def verdict(self, answer: str | None, finish_reason: str | None, prompt: Prompt) -> Verdict:
        """wrong (the answer is not in it), long (right, but over max_words or cut at
        max_tokens) or right."""
        if not is_correct(answer, prompt):
            return "wrong"
        if finish_reason != "stop" or word_count(answer) > self.max_words:
            return "long"
        return "right"

    def met(self, answer: str | None, finish_reason: str | None, prompt: Prompt) -> bool:
        return self.verdict(answer, finish_reason, prompt) == "right"

    def reply(self, verdict: Verdict, prompt: Prompt, rng: random.Random) -> str:
        """What the user says next: one of the phrasings of ``verdict``'s kind."""
        phrasings = {"right": THANKS, "wrong": CORRECTIONS, "long": SHORTER}[verdict]
        return rng.choice(phrasings).format(answer=prompt.answer, max_words=self.max_words)

    def describe(self) -> str:
        return (
            f"right and short: the right answer in at most {self.max_words} words, ended by itself"
        )
