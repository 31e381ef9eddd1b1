"""What the simulated users prefer, and what they say about an answer: the pure part.

The users prefer brevity: an answer that ends by itself within ``max_words``
words gets thanks, anything longer gets a request to redo it shorter. The two
replies are worded so the rules judge scores them +1 and -1 (never 0, which
would exclude the sample), and an LLM judge reads them the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WORD = re.compile(r"\S+")


def word_count(text: str | None) -> int:
    return len(WORD.findall(text or ""))


@dataclass(frozen=True)
class Brevity:
    """Users who want answers of at most ``max_words`` words."""

    max_words: int = 10
    met_reply: str = "Thanks, perfect!"
    unmet_reply: str = "No, too long. Try again, shorter please."

    def met(self, answer: str | None, finish_reason: str | None) -> bool:
        """The answer ended by itself (not cut at max_tokens) within max_words words."""
        return finish_reason == "stop" and 0 < word_count(answer) <= self.max_words

    def reply(self, met: bool) -> str:
        return self.met_reply if met else self.unmet_reply

    def describe(self) -> str:
        return f"brevity: an answer of at most {self.max_words} words that ends by itself"
