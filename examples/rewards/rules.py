"""A rule check for the rule + model hybrid: cheap hard constraints on the response.

Score 1.0 when the response is not empty, at most ``max_chars`` long and free
of banned words; 0.0 otherwise (the hybrid then skips the model judge).
"""

from __future__ import annotations

from pipeline.rewards import RewardInput, RewardOutput, response_text


class ResponseRule:
    def __init__(self, max_chars: int = 4000, banned: list[str] | None = None) -> None:
        self.max_chars = max_chars
        self.banned = [w.lower() for w in (banned or ["as an ai language model"])]

    def setup(self) -> None:
        pass

    def process(self, input: RewardInput) -> RewardOutput:
        text = response_text(input).strip()
        checks = {
            "not_empty": float(bool(text)),
            "within_length": float(len(text) <= self.max_chars),
            "no_banned_words": float(not any(w in text.lower() for w in self.banned)),
        }
        return RewardOutput.success(float(all(checks.values())), checks)
