"""What the engine is asked (a Request) and what it hands back, token by token (a Job)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.serving.sampling import Sampling
from pipeline.serving.text import TextTracker

TopLogprobs = list[tuple[float, int]]


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    sampling: Sampling
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: log-probs of output tokens only
    top_logprobs_num: int = 0

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.return_logprob and 0 <= self.logprob_start_len < len(self.prompt_ids)


@dataclass
class Event:
    """One step of a job: a token (with the text it makes safe to show), or the end."""

    kind: str  # "token" | "done" | "error"
    delta: str = ""
    token: int | None = None
    logprob: float | None = None
    top: TopLogprobs | None = None
    error: str | None = None


@dataclass
class Job:
    """A request being served: its state inside the engine, and where its events go."""

    request: Request
    emit: Callable[[Event], None]
    max_new_tokens: int
    tracker: TextTracker
    generator: Any = None  # torch.Generator when the request fixed a seed
    grammar: Any = None  # its xgrammar.GrammarMatcher when the request has a grammar
    cancelled: bool = False
    version: str = ""
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[TopLogprobs] = field(default_factory=list)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top: list[TopLogprobs | None] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    text: str = ""

    @property
    def stop_tokens_trimmed(self) -> bool:
        """The last output token is a matched stop token left out of the text."""
        return (
            self.finish is not None
            and isinstance(self.finish.get("matched"), int)
            and not self.request.sampling.no_stop_trim
        )
