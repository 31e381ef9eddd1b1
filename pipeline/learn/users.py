"""The simulated user population: agents' users talking to the policy through the proxy.

Each user asks a training prompt in a new session (``X-Session-Id``,
``X-Turn-Type: main``) with the official ``openai`` SDK, reads the answer and
replies as its preference says. The reply is the turn's next state: it goes
out as the session's last request (``X-Session-Done``), whose own answer
nobody reads, so it is limited to one token.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.learn.preference import RightAndShort, word_count
from pipeline.learn.prompts import Prompt

if TYPE_CHECKING:  # imported when users run: it takes a second to import
    import openai

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """How the users' requests ask the policy to sample (the same for evaluation)."""

    temperature: float = 1.0
    max_tokens: int = 48
    model: str = "default"


@dataclass
class ServedTurn:
    """One answer a user got, what it thought of it, and when."""

    session_id: str
    prompt_id: str
    version: int | None  # the policy version that served it
    words: int
    met: bool
    served_at: float
    replied_at: float | None = None  # when its reply (the next state) was recorded
    correct: bool = False  # it held the prompt's answer (met: also short, and ended by itself)


def served_version(completion: Any) -> int | None:
    """The weight version an SGLang-protocol server reports in ``metadata.weight_version``."""
    metadata = getattr(completion, "metadata", None)  # a declared field in newer SDKs
    if metadata is None:
        metadata = (getattr(completion, "model_extra", None) or {}).get("metadata") or {}
    value = metadata.get("weight_version") if isinstance(metadata, dict) else None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


@dataclass
class Population:
    """``users`` users asking ``prompts`` through ``base_url`` until stopped."""

    base_url: str
    prompts: list[Prompt]
    preference: RightAndShort
    sampling: Sampling
    users: int
    run_id: str
    seed: int = 0
    turns: list[ServedTurn] = field(default_factory=list)
    failures: int = 0
    # Sessions that may have started so far (set from another thread; None: no limit).
    # A user takes its place before its session starts, so no session can slip past a
    # limit that the thread setting it has not caught up with yet.
    allowed: int | None = None
    started: int = 0
    stopping: bool = False
    # consecutive sessions (in the order they start) that ask the same prompt: 1, each user
    # picks its own; G > 1, the sessions started G at a time share one, so a step's samples
    # come in groups of answers to one question (the trainer's baseline_group prompt)
    group_size: int = 1

    @property
    def paused(self) -> bool:
        return self.allowed is not None and self.started >= self.allowed

    async def run(self) -> None:
        """Every user's sessions, one after another, until ``stopping``."""
        import openai

        async with openai.AsyncOpenAI(
            base_url=self.base_url.rstrip("/") + "/v1",
            api_key="unused",
            timeout=300.0,
            max_retries=2,
        ) as client:
            await asyncio.gather(*(self._user(client, k) for k in range(self.users)))

    async def _user(self, client: openai.AsyncOpenAI, k: int) -> None:
        import openai

        rng = random.Random(self.seed * 1_000_003 + k)
        session = 0
        while not self.stopping:
            if self.paused:
                await asyncio.sleep(0.05)  # held: look again soon (a step waits on them)
                continue
            self.started += 1
            prompt = self._prompt(rng, self.started - 1)
            session_id = f"{self.run_id}-u{k}-s{session}"
            session += 1
            try:
                await self._session(client, session_id, prompt, rng)
            except openai.OpenAIError as exc:  # counted and shown; the user goes on
                self.failures += 1
                if not any(t.session_id == session_id for t in reversed(self.turns)):
                    self.started -= 1  # nothing was served: the place is free again
                log.warning("session %s failed: %s", session_id, exc)
                await asyncio.sleep(1.0)

    def _prompt(self, rng: random.Random, index: int) -> Prompt:
        """The prompt of the session started ``index``-th (from 0): the user's own pick, or,
        in groups, the pick of the group of sessions it starts in."""
        if self.group_size == 1:
            return rng.choice(self.prompts)
        return random.Random(f"{self.seed}/{index // self.group_size}").choice(self.prompts)

    async def _session(
        self, client: openai.AsyncOpenAI, session_id: str, prompt: Prompt, rng: random.Random
    ) -> None:
        """Ask, judge the answer by the preference, reply (the next state), close."""
        asked = [{"role": "user", "content": prompt.text}]
        headers = {"X-Session-Id": session_id, "X-Turn-Type": "main"}
        answer = await client.chat.completions.create(
            model=self.sampling.model,
            messages=asked,  # type: ignore[arg-type]
            temperature=self.sampling.temperature,
            max_tokens=self.sampling.max_tokens,
            extra_headers=headers,
        )
        choice = answer.choices[0]
        text = choice.message.content or ""
        verdict = self.preference.verdict(text, choice.finish_reason, prompt)
        turn = ServedTurn(
            session_id,
            prompt.id,
            served_version(answer),
            word_count(text),
            verdict == "right",
            time.time(),
            correct=verdict != "wrong",
        )
        self.turns.append(turn)
        follow_up = [
            *asked,
            {"role": "assistant", "content": text},
            {"role": "user", "content": self.preference.reply(verdict, prompt, rng)},
        ]
        await client.chat.completions.create(
            model=self.sampling.model,
            messages=follow_up,  # type: ignore[arg-type]
            temperature=self.sampling.temperature,
            max_tokens=1,
            extra_headers={**headers, "X-Session-Done": "true"},
        )
        turn.replied_at = time.time()
