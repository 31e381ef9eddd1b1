"""Judge simulator: a test double speaking SGLang's and OpenAI's HTTP protocols.

It is not a model. Votes come from a scripted distribution: each judged
prompt gets a hidden "true" label (drawn from ``--vote-dist``, stable per
prompt), and each call returns it with probability ``--agreement``, else
another label. It models capacity (concurrent slots; excess requests queue),
latency, and faults (5xx, timeouts, malformed output). It keeps the bodies of
the last requests it received (``GET /sim/requests``), so a test can check
what reached the judge. Tests and benchmarks use it; nothing in production does.

    python -m pipeline.testing.judge_sim --port 30010 --agreement 0.8 --slots 64
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import random
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

HINT_MARKER = "[HINT_START]"
_FIRST = re.compile(r"First output:\n<response_a>\n(.*?)\n</response_a>", re.DOTALL)
_SECOND = re.compile(r"Second output:\n<response_b>\n(.*?)\n</response_b>", re.DOTALL)


@dataclass
class SimConfig:
    vote_dist: dict[int, float] = field(default_factory=lambda: {1: 0.5, -1: 0.3, 0: 0.2})
    agreement: float = 0.8
    hint: str = "Read the tool output carefully and quote the exact figure it returns."
    latency_ms: float = 0.0
    latency_jitter_ms: float = 0.0  # uniform: latency_ms ± jitter
    latency_dist: str = "uniform"  # or "exponential" (mean latency_ms)
    slots: int = 64
    error_rate: float = 0.0  # requests answered with HTTP 503
    timeout_rate: float = 0.0  # requests never answered in time
    malformed_rate: float = 0.0  # outputs without a valid \boxed{}
    position_bias: float = 0.0  # pairwise prompts: answer "A" (the first shown) regardless
    seed: int = 0
    recorded: int = 256  # request bodies kept for GET /sim/requests (the newest)


@dataclass
class SimStats:
    requests: int = 0  # HTTP requests (a /generate batch is one request, many calls)
    calls: int = 0
    errors: int = 0  # requests
    timeouts: int = 0  # requests
    malformed: int = 0  # outputs
    busy_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    max_in_flight: int = 0

    def as_dict(self, slots: int) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return {
            "requests": self.requests,
            "calls": self.calls,
            "errors": self.errors,
            "timeouts": self.timeouts,
            "malformed": self.malformed,
            "max_in_flight": self.max_in_flight,
            "busy_slot_seconds": round(self.busy_s, 3),
            "elapsed_s": round(elapsed, 3),
            "slot_utilisation": round(self.busy_s / (elapsed * slots), 4),
        }


class JudgeSimulator:
    """The simulator's state and HTTP handlers."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.slots = asyncio.Semaphore(config.slots)
        self.stats = SimStats()
        self.bodies: deque[dict[str, Any]] = deque(maxlen=config.recorded)

    def true_label(self, prompt: str) -> int:
        digest = hashlib.sha256(f"{self.config.seed}:{prompt}".encode()).digest()
        point = int.from_bytes(digest[:8], "big") / 2**64
        acc = 0.0
        for label, weight in self.config.vote_dist.items():
            acc += weight / sum(self.config.vote_dist.values())
            if point < acc:
                return label
        return next(iter(self.config.vote_dist))

    def quality(self, text: str) -> float:
        """The hidden quality of one output (stable per text and seed)."""
        digest = hashlib.sha256(f"{self.config.seed}:quality:{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def preference_text(self, prompt: str) -> str:
        """A pairwise answer: the output of higher hidden quality, whichever came first."""
        cfg = self.config
        first, second = (m.group(1) for m in (_FIRST.search(prompt), _SECOND.search(prompt)) if m)
        if self.rng.random() < cfg.position_bias:
            return "The first output reads better.\n\\boxed{A}"
        qa, qb = self.quality(first), self.quality(second)
        truth = "tie" if first == second else ("A" if qa > qb else "B")
        if self.rng.random() >= cfg.agreement:
            truth = self.rng.choice([v for v in ("A", "B", "tie") if v != truth])
        return f"Comparing both outputs on the conversation.\n\\boxed{{{truth}}}"

    def vote_text(self, prompt: str) -> str:
        """One judge output for ``prompt`` (hint prompts get the hint format, pairwise
        prompts an A/B/tie preference)."""
        cfg = self.config
        if self.rng.random() < cfg.malformed_rate:
            self.stats.malformed += 1
            return "I cannot decide. Final score: \\boxed{maybe}"
        if _FIRST.search(prompt) and _SECOND.search(prompt):
            return self.preference_text(prompt)
        hinting = HINT_MARKER in prompt
        labels = [1, -1] if hinting else [-1, 0, 1]
        truth = self.true_label(prompt)
        truth = truth if truth in labels else -1
        vote = (
            truth
            if self.rng.random() < cfg.agreement
            else self.rng.choice([v for v in labels if v != truth])
        )
        if hinting and vote == 1:
            return f"The next state shows a gap.\n\\boxed{{1}}\n[HINT_START]{cfg.hint}[HINT_END]"
        return f"Weighing the next state as evidence.\n\\boxed{{{vote}}}"

    def latency_ms(self) -> float:
        cfg = self.config
        if cfg.latency_dist == "exponential" and cfg.latency_ms > 0:
            return self.rng.expovariate(1.0 / cfg.latency_ms)
        return max(0.0, cfg.latency_ms + self.rng.uniform(-1, 1) * cfg.latency_jitter_ms)

    async def _serve(self, calls: int = 1) -> str | None:
        """Serve one request of ``calls`` calls, each holding a slot for its latency; None
        means answer normally, else the fault to show. A fault is the request's (a server
        fails or drops a whole request), so a batch is as likely to fail as a single call."""
        cfg = self.config
        fault = self.rng.random()
        if fault < cfg.timeout_rate:  # never answers, and holds no slot (the client gave up)
            self.stats.calls += calls
            self.stats.timeouts += 1
            await asyncio.sleep(3600)
        await asyncio.gather(*(self._call() for _ in range(calls)))
        if fault < cfg.timeout_rate + cfg.error_rate:
            self.stats.errors += 1
            return "error"
        return None

    async def _call(self) -> None:
        async with self.slots:
            self.stats.calls += 1
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            start = time.monotonic()
            try:
                delay = self.latency_ms()
                if delay > 0:
                    await asyncio.sleep(delay / 1000)
            finally:
                self.stats.in_flight -= 1
                self.stats.busy_s += time.monotonic() - start

    async def generate(self, request: web.Request) -> web.Response:
        self.stats.requests += 1
        body = await request.json()
        self.bodies.append({"path": "/generate", "body": body})
        params = body.get("sampling_params", {})
        n = int(params.get("n", 1) or 1)  # SGLang's parallel sampling: n answers, one slot each
        text = body.get("text")
        texts = text if isinstance(text, list) else [text]  # a batch: a slot per prompt per answer
        if await self._serve(n * len(texts)) == "error":
            return web.json_response({"error": "simulated overload"}, status=503)
        if "input_ids" in body:
            return web.json_response(self._logprobs(body, params))
        if not texts or not all(isinstance(t, str) for t in texts):
            return web.json_response({"error": "'text' or 'input_ids' required"}, status=400)
        # SGLang's order: each prompt's n answers together
        answers = [self._answer(t) for t in texts for _ in range(n)]
        return web.json_response(answers if len(answers) > 1 else answers[0])

    def _answer(self, text: str) -> dict[str, Any]:
        out = self.vote_text(text)
        meta = {"prompt_tokens": len(text) // 4, "completion_tokens": len(out) // 4,
                "finish_reason": {"type": "stop"}}  # fmt: skip
        return {"text": out, "meta_info": meta}

    def _logprobs(self, body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        """Teacher log-prob answer: one entry per input position from logprob_start_len.

        As in SGLang, position 0 of a sequence has no log-prob (None). Top-K
        entries are K distinct ids no larger than the largest input id (so they
        fit the caller's vocabulary), with probabilities summing below 1.
        """
        ids: list[int] = body["input_ids"]
        start = int(body.get("logprob_start_len", 0))
        top_k = int(body.get("top_logprobs_num", 0) or 0)
        rng = random.Random(hash((tuple(ids), self.config.seed)))
        entries: list[list[Any]] = []
        tops: list[Any] = []
        vocab = max(ids) + 1 if ids else 1
        for pos in range(start, len(ids)):
            lp = None if pos == 0 else -rng.uniform(0.01, 4.0)
            entries.append([lp, ids[pos], None])
            if top_k:
                tops.append(None if lp is None else self._top_k(rng, top_k, vocab))
        meta: dict[str, Any] = {"input_token_logprobs": entries, "prompt_tokens": len(ids)}
        if top_k:
            meta["input_top_logprobs"] = tops
        return {"text": "", "meta_info": meta}

    @staticmethod
    def _top_k(rng: random.Random, k: int, vocab: int) -> list[list[Any]]:
        picked = rng.sample(range(vocab), min(k, vocab))
        weights = sorted((rng.uniform(0.05, 1.0) for _ in picked), reverse=True)
        scale = rng.uniform(0.5, 0.95) / sum(weights)
        return [[math.log(w * scale), t, None] for w, t in zip(weights, picked, strict=True)]

    async def chat(self, request: web.Request) -> web.Response:
        self.stats.requests += 1
        body = await request.json()
        self.bodies.append({"path": "/v1/chat/completions", "body": body})
        if await self._serve() == "error":
            return web.json_response({"error": {"message": "simulated overload"}}, status=503)
        messages = body.get("messages") or []
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        n = int(body.get("n", 1) or 1)
        choices = [
            {
                "index": i,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": self.vote_text(prompt)},
            }
            for i in range(n)
        ]
        return web.json_response(
            {
                "id": f"sim-{self.stats.calls}",
                "object": "chat.completion",
                "model": body.get("model", "judge-sim"),
                "choices": choices,
            }
        )

    async def stats_handler(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats.as_dict(self.config.slots))

    async def requests_handler(self, _request: web.Request) -> web.Response:
        """The recorded request bodies, oldest first: ``[{path, body}, ...]``."""
        return web.json_response(list(self.bodies))

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "simulator": True})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/sim/stats", self.stats_handler)
        app.router.add_get("/sim/requests", self.requests_handler)
        app.router.add_get("/health", self.health)
        return app


def _vote_dist(text: str) -> dict[int, float]:
    """'1:0.5,-1:0.3,0:0.2' -> {1: 0.5, -1: 0.3, 0: 0.2}"""
    dist = {}
    for part in text.split(","):
        label, weight = part.split(":")
        dist[int(label)] = float(weight)
    return dist


def main() -> None:
    parser = argparse.ArgumentParser(description="Judge simulator (a test double).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30010)
    parser.add_argument("--vote-dist", type=_vote_dist, default="1:0.5,-1:0.3,0:0.2")
    parser.add_argument("--agreement", type=float, default=0.8)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--latency-jitter-ms", type=float, default=0.0)
    parser.add_argument("--latency-dist", choices=["uniform", "exponential"], default="uniform")
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument(
        "--error-rate", type=float, default=0.0, help="share of requests answered with 503"
    )
    parser.add_argument(
        "--timeout-rate", type=float, default=0.0, help="share of requests never answered"
    )
    parser.add_argument(
        "--malformed-rate", type=float, default=0.0, help="share of outputs with no valid box"
    )
    parser.add_argument(
        "--position-bias", type=float, default=0.0, help="pairwise: answer A this often"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = SimConfig(
        vote_dist=args.vote_dist,
        agreement=args.agreement,
        latency_ms=args.latency_ms,
        latency_jitter_ms=args.latency_jitter_ms,
        latency_dist=args.latency_dist,
        slots=args.slots,
        error_rate=args.error_rate,
        timeout_rate=args.timeout_rate,
        malformed_rate=args.malformed_rate,
        position_bias=args.position_bias,
        seed=args.seed,
    )

    async def build() -> web.Application:
        return JudgeSimulator(config).app()

    print(f"judge simulator (test double) on http://{args.host}:{args.port}", flush=True)
    web.run_app(build(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
