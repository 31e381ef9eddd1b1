"""HTTP clients for the judge: SGLang native /generate or an OpenAI-compatible API.

One aiohttp session per process, a timeout on every request, bounded
concurrency, and bounded retries with exponential backoff and jitter on
connection errors, timeouts, 429 and 5xx. A judge that stays unreachable
raises :class:`JudgeUnavailable`: the caller routes the pair to the retry
topic; it never becomes a score.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from pipeline.backoff import RetryPolicy, retry_async
from pipeline.errors import TurnstreamError
from pipeline.judge import metrics
from pipeline.judge.batching import GenerateBatcher
from pipeline.judge.prompts import eval_regex, hint_regex

log = logging.getLogger(__name__)

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
# 4 tries, a random wait up to 0.5 s, 1 s, 2 s between (TURNSTREAM_SCORING_JUDGE_MAX_ATTEMPTS
# and _JUDGE_BACKOFF_MAX_S set the tries and the longest wait)
JUDGE_RETRY = RetryPolicy(max_attempts=4, initial_delay_s=0.5, max_delay_s=8.0, jitter=True)
JSON = {"Content-Type": "application/json"}


class JudgeUnavailable(TurnstreamError):
    """Every attempt to reach the judge failed transiently (a FAILED task, not a score)."""


@dataclass(frozen=True)
class JudgeConfig:
    backend: Literal["sglang", "openai"]
    urls: Sequence[str]
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0
    retry: RetryPolicy = JUDGE_RETRY
    concurrency: int = 64
    temperature: float = 0.6
    top_p: float = 1.0
    max_new_tokens: int = 4096
    hint_max_new_tokens: int = 8192
    batch_max: int = 32  # SGLang: prompts asked together in one /generate (1: one per call)
    batch_wait_s: float = 0.0  # SGLang: how long a request waits for more prompts
    # regex-constrained votes (SGLang's sampling_params.regex; OpenAI: the regex body field);
    # auto: on when the SGLang judge's /get_model_info says it serves a trained judge
    constrained: Literal["auto", "on", "off"] = "off"
    reason_chars: int = 200
    role: str = "judge"  # what errors call the server: the judge, or the OPD teacher


def chatml(messages: Sequence[dict[str, Any]]) -> str:
    """A ChatML rendering, used when no judge tokenizer path is configured."""
    body = "".join(
        f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages
    )
    return body + "<|im_start|>assistant\n"


class JudgeClient:
    """Ask the judge for n outputs to one prompt; count every call made."""

    def __init__(
        self, config: JudgeConfig, render: Callable[[Sequence[dict[str, Any]]], str] = chatml
    ) -> None:
        if not config.urls:
            raise TurnstreamError(f"the {config.backend} {config.role} needs at least one URL")
        self.config = config
        self.render = render
        self._urls = [u.rstrip("/") for u in config.urls]
        self._next = itertools.count()
        self._limit = asyncio.Semaphore(config.concurrency)
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0
        self.retries = 0
        self._batcher = GenerateBatcher(self._generate, config.batch_max, config.batch_wait_s)
        # Set once by the event loop's first vote (auto: after asking the server), then read.
        self._constrained: bool | None = {"on": True, "off": False}.get(config.constrained)

    def _open(self) -> aiohttp.ClientSession:
        """The one HTTP session, created on first use inside the running event loop."""
        if self._session is None or self._session.closed:
            key = self.config.api_key
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
                headers={"Authorization": f"Bearer {key}"} if key else {},
                connector=aiohttp.TCPConnector(limit=self.config.concurrency),
            )
        return self._session

    async def close(self) -> None:
        await self._batcher.close()
        if self._session is not None:
            await self._session.close()

    async def __aenter__(self) -> JudgeClient:
        self._open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def post(
        self,
        path: str,
        body: dict[str, Any] | None,
        check: Callable[[Any, str], None] | None = None,
    ) -> Any:
        """POST with retries; calls spread over replicas, and each retry moves to the next one.
        A body of None is a GET. ``check(answer, url)`` may refuse a 200 answer as transient
        (JudgeUnavailable): that try counts as failed and the request is asked again."""
        session = self._open()
        first = next(self._next)

        def url(attempt: int) -> str:
            return self._urls[(first + attempt - 1) % len(self._urls)] + path

        async def once(attempt: int) -> Any:
            where = url(attempt)
            answer = await self._post_once(session, where, body)
            if check is not None:
                check(answer, where)
            return answer

        try:
            return await retry_async(
                once, self.config.retry, (JudgeUnavailable,), on_retry=self._retrying
            )
        except JudgeUnavailable as exc:
            raise JudgeUnavailable(
                f"{self.config.role} unreachable after {self.config.retry.max_attempts} "
                f"attempts: {exc}"
            ) from exc

    async def _post_once(
        self, session: aiohttp.ClientSession, url: str, body: dict[str, Any] | None
    ) -> Any:
        """One request; JudgeUnavailable when the failure is transient (tried again)."""
        try:
            async with self._limit:
                self.requests += body is not None  # judge calls, not the model-info query
                call = (
                    session.get(url)
                    if body is None
                    else session.post(url, data=orjson.dumps(body), headers=JSON)
                )
                async with call as resp:
                    if resp.status == 200:
                        return orjson.loads(await resp.read())
                    text = (await resp.text())[:300]
                    if resp.status not in RETRYABLE_STATUS:
                        raise TurnstreamError(
                            f"{self.config.role} {url} answered {resp.status}: {text}"
                        )
                    raise JudgeUnavailable(f"HTTP {resp.status} from {url}: {text}")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise JudgeUnavailable(f"{type(exc).__name__} talking to {url}: {exc}") from exc
        except TimeoutError as exc:
            raise JudgeUnavailable(
                f"no answer from {url} within {self.config.timeout_s:g}s"
            ) from exc

    def _retrying(self, _attempt: int, _error: BaseException, _delay_s: float) -> None:
        self.retries += 1
        metrics.JUDGE_RETRIES.inc()

    async def complete(
        self, messages: list[dict[str, Any]], n: int, hint: bool = False
    ) -> list[str]:
        """n judge outputs for one chat prompt (votes are independent samples), in one request
        (SGLang: one with the other prompts asked in the same loop turn)."""
        max_new = self.config.hint_max_new_tokens if hint else self.config.max_new_tokens
        regex = await self.vote_regex(hint)
        if self.config.backend == "openai":
            return await self._chat(messages, n, max_new, regex)
        return await self._batcher.ask(self.render(messages), n, max_new, regex)

    async def vote_regex(self, hint: bool) -> str | None:
        """The regex a vote is asked with, or None for free votes (the setting; auto: whether
        the judge server says it serves a judge trained by `turnstream judge train`)."""
        if self._constrained is None:
            self._constrained = await self._serves_trained_judge()
        if not self._constrained:
            return None
        chars = self.config.reason_chars
        return hint_regex(chars) if hint else eval_regex(chars)

    async def _serves_trained_judge(self) -> bool:
        if self.config.backend != "sglang":
            return False
        try:
            info = await self.post("/get_model_info", None)
        except TurnstreamError as exc:  # answered, but not 200: no model info, so no judge of ours
            if isinstance(exc, JudgeUnavailable):
                raise
            info = {}
        trained = isinstance(info, dict) and bool(info.get("turnstream_judge"))
        log.info(
            "judge at %s: %s; votes are %s",
            self._urls[0],
            "a trained turnstream judge" if trained else "no turnstream judge",
            "regex-constrained" if trained else "free (set judge_constrained=on to constrain)",
        )
        return trained

    async def _generate(
        self, texts: list[str], n: int, max_new: int, regex: str | None = None
    ) -> list[str]:
        """SGLang /generate: n answers to each of ``texts``, each prompt's n together."""
        body: dict[str, Any] = {
            "text": texts[0] if len(texts) == 1 else texts,
            "return_logprob": False,
            "sampling_params": {
                "temperature": self.config.temperature,
                "top_p": self.config.top_p,
                "top_k": -1,
                "max_new_tokens": max_new,
                "skip_special_tokens": False,
                "no_stop_trim": True,
                "spaces_between_special_tokens": False,
            },
        }
        if n > 1:  # SGLang's parallel sampling: one answer per vote, a list of them
            body["sampling_params"]["n"] = n
        if regex is not None:
            body["sampling_params"]["regex"] = regex
        data = await self.post("/generate", body)
        results = data if isinstance(data, list) else [data]
        if len(results) != n * len(texts):
            raise TurnstreamError(
                f"judge answered {len(results)} outputs for {len(texts)} prompt(s) with n={n}"
            )
        return [r.get("text", "") if isinstance(r, dict) else "" for r in results]

    async def _chat(
        self, messages: list[dict[str, Any]], n: int, max_new: int, regex: str | None = None
    ) -> list[str]:
        body: dict[str, Any] = {
            "model": self.config.model or "judge",
            "messages": messages,
            "n": n,
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
            "max_tokens": max_new,
        }
        if regex is not None:  # SGLang's OpenAI endpoint takes it as an extra body field
            body["regex"] = regex
        data = await self.post("/v1/chat/completions", body)
        return [c["message"].get("content") or "" for c in data["choices"]]

    async def teacher_logprobs(
        self, input_ids: list[int], response_len: int, top_k: int = 0
    ) -> dict[str, Any]:
        """Log-probs of the last ``response_len`` tokens of ``input_ids`` (SGLang /generate)."""
        # SGLang gives no log-prob (None) for the first position it returns: ask from the
        # position before the response so every response token gets one.
        body: dict[str, Any] = {
            "input_ids": input_ids,
            "return_logprob": True,
            "logprob_start_len": max(0, len(input_ids) - response_len - 1),
            "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        }
        if top_k:
            body["top_logprobs_num"] = top_k
        data = await self.post("/generate", body, check=_scored_whole)
        meta = data["meta_info"]
        # The first position returned has no log-prob (None); keep the last response_len values.
        logprobs = [float(e[0]) for e in meta["input_token_logprobs"] if e[0] is not None]
        logprobs = logprobs[-response_len:]
        if len(logprobs) != response_len:
            raise TurnstreamError(
                f"teacher returned {len(logprobs)} log-probs for {response_len} response tokens"
            )
        out: dict[str, Any] = {"logprobs": logprobs}
        if top_k:
            tops = [t for t in meta.get("input_top_logprobs", []) if t is not None]
            out["top_logprobs"] = tops[-response_len:]
        return out


def _scored_whole(answer: Any, url: str) -> None:
    """A teacher answer covers the prompt, or the request was cut short and is asked again.

    SGLang answers an aborted request (a weight update that aborts running requests, a
    server draining) with 200 and ``finish_reason.type`` abort, its log-probs missing or
    partial: taken as it is, that would be a wrong teacher signal, so it is transient
    trouble. An answer without ``input_token_logprobs`` for another reason is an error.
    """
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict):
        raise TurnstreamError(f"teacher {url} answered without meta_info: {str(answer)[:200]}")
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise JudgeUnavailable(
            f"teacher {url} aborted the request ({finish.get('message') or 'no reason given'})"
        )
    if not isinstance(meta.get("input_token_logprobs"), list):
        raise TurnstreamError(
            f"teacher {url} answered without input_token_logprobs: it must be an SGLang "
            "/generate server that returns prompt log-probs (return_logprob, logprob_start_len)"
        )
