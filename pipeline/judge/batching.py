"""Prompts asked close together go to SGLang in one /generate request.

SGLang's /generate takes a list of prompts (``text``) with ``sampling_params.n``
answers each, and answers with one flat list, each prompt's n answers together
(``tokenizer_manager._handle_batch_request``). A scoring worker judges many
pairs at once: asking for them in one request instead of one request a pair
saves an HTTP request per pair on both sides (about a third of a millisecond of
the worker's CPU each). A batch holds what was asked before the loop got back to
it, or, with a ``wait_s``, what was asked within that long of its first prompt: a
worker reads its pairs one loop turn apart, so without a wait even a busy worker
sends one request a pair.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

# (prompts, n, max_new_tokens, regex) -> len(prompts) * n answers, each prompt's n together
SendBatch = Callable[[list[str], int, int, str | None], Awaitable[list[str]]]
Key = tuple[int, int, str | None]


class GenerateBatcher:
    """Collects the prompts asked within ``wait_s`` of a batch's first one (0: in the same
    loop turn) with the same n, token limit and regex into requests of at most ``limit`` prompts;
    each asker gets its own n answers, or the request's error."""

    def __init__(self, send: SendBatch, limit: int, wait_s: float = 0.0) -> None:
        self._send = send
        self._limit = limit
        self._wait_s = wait_s
        self._waiting: dict[Key, list[tuple[str, asyncio.Future[list[str]]]]] = {}
        self._running: set[asyncio.Future[None]] = set()
        self._timers: dict[Key, asyncio.Handle] = {}

    async def ask(
        self, text: str, n: int, max_new_tokens: int, regex: str | None = None
    ) -> list[str]:
        key = (n, max_new_tokens, regex)
        asks = self._waiting.get(key)
        if asks is None:
            asks = self._waiting[key] = []
            loop = asyncio.get_running_loop()
            self._timers[key] = (
                loop.call_later(self._wait_s, self._flush, key)
                if self._wait_s > 0
                else loop.call_soon(self._flush, key)
            )
        answer: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        asks.append((text, answer))
        if len(asks) >= self._limit:
            self._flush(key)
        return await answer

    def _flush(self, key: Key) -> None:
        """Send the batch waiting under ``key``; its timer goes with it (a batch sent full
        must not have its timer send the next one early)."""
        asks = self._waiting.pop(key, None)
        if (timer := self._timers.pop(key, None)) is not None:
            timer.cancel()
        if asks:
            task = asyncio.ensure_future(self._request(asks, *key))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _request(
        self,
        asks: list[tuple[str, asyncio.Future[list[str]]]],
        n: int,
        max_new_tokens: int,
        regex: str | None,
    ) -> None:
        try:
            answers = await self._send([text for text, _ in asks], n, max_new_tokens, regex)
        except asyncio.CancelledError:
            for _, answer in asks:
                answer.cancel()
            raise
        except Exception as exc:  # the request's error is each asker's
            for _, answer in asks:
                if not answer.done():
                    answer.set_exception(exc)
            return
        for i, (_, answer) in enumerate(asks):
            if not answer.done():  # an asker that was cancelled has gone
                answer.set_result(answers[i * n : (i + 1) * n])

    async def close(self) -> None:
        """Cancel the requests under way and the batches still waiting (nothing is sent)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for asks in self._waiting.values():
            for _, answer in asks:
                answer.cancel()
        self._waiting.clear()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
