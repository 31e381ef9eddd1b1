"""Policy-server simulator: a test double for an SGLang (OpenAI-compatible) policy server.

It is no model. It speaks the parts of the protocol turnstream uses:

- ``POST /v1/chat/completions``: a deterministic answer built from the last
  user message, streamed (SSE, one chunk per token) or not, with per-token
  log-probs when ``logprobs`` is set, token ids when ``return_token_ids`` is
  set, ``max_tokens`` (finish reason ``length``), and a tool call when the
  request offers tools and the last user message names one of them (unless
  the last message is a tool's result: that gets an answer in words);
- ``GET /v1/models``;
- ``POST /update_weights_from_disk``: records the path and bumps the version
  it reports (optionally failing the first N calls);
- ``GET /sim/updates``, ``GET /sim/requests`` (the bodies it received) and
  ``GET /health``.

    python -m pipeline.testing.policy_sim --port 30020 [--latency-ms 5 --token-delay-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

MODEL = "policy-sim"
VOCAB = 32000
SILENT = "[end your turn at once]"  # a user message with it gets an empty, finished answer


@dataclass
class PolicySimConfig:
    fail_first: int = 0  # weight updates answered 503 before the first success
    chat_fail_first: int = 0  # chat requests answered 500 before the first success
    latency_ms: float = 0.0  # before the first token
    token_delay_ms: float = 0.0  # between streamed tokens
    keep_requests: int = 1000  # request bodies kept for /sim/requests


def _words(text: str) -> list[str]:
    """Split into 'tokens': each word keeps its leading space, like BPE pieces."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out.append(word if i == 0 else " " + word)
    return [w for w in out if w]


def _token_id(piece: str) -> int:
    return int.from_bytes(hashlib.blake2s(piece.encode()).digest()[:4], "big") % VOCAB


def _logprob(piece: str, position: int) -> float:
    h = int.from_bytes(hashlib.blake2s(f"{position}:{piece}".encode()).digest()[:2], "big")
    return -round(0.01 + 3.0 * h / 65535, 4)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


class PolicySimulator:
    def __init__(self, config: PolicySimConfig | None = None) -> None:
        self.config = config or PolicySimConfig()
        self.calls = 0
        self.chat_calls = 0
        self.loaded: list[str] = []
        self.requests: list[dict[str, Any]] = []
        # Scripted answers, taken from the front (the test appends, the server's loop pops).
        self.replies: list[str] = []

    @property
    def version(self) -> int:
        return len(self.loaded)

    # -- weight updates -------------------------------------------------------

    async def update_weights(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        self.calls += 1
        if self.calls <= self.config.fail_first:
            return web.json_response({"success": False, "message": "simulated failure"}, status=503)
        self.loaded.append(str(body.get("model_path")))
        return web.json_response({"success": True, "message": "loaded (simulator)"})

    async def updates(self, _request: web.Request) -> web.Response:
        return web.json_response({"calls": self.calls, "loaded": self.loaded})

    # -- chat -----------------------------------------------------------------

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "simulator"}],
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"body is not JSON: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "messages: field required (a list of chat messages)")
        self.requests.append(body)
        del self.requests[: -self.config.keep_requests]
        self.chat_calls += 1
        if self.chat_calls <= self.config.chat_fail_first:
            return _error(500, "simulated policy server failure", kind="server_error")
        if self.config.latency_ms:
            await asyncio.sleep(self.config.latency_ms / 1000)
        answer = self._answer(body)
        if body.get("stream"):
            return await self._stream(request, body, answer)
        return web.json_response(self._completion(body, answer))

    def _answer(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.replies:
            return _limited(body, _words(self.replies.pop(0)))
        messages = body["messages"]
        last_user = next(
            (_text_of(m.get("content")) for m in reversed(messages) if m.get("role") == "user"),
            "",
        )
        answered = bool(messages) and messages[-1].get("role") == "tool"
        tool = None if answered else self._tool_to_call(body, last_user)
        if tool is not None:
            args = orjson.dumps({"query": last_user[:40]}).decode()
            pieces = [args[i : i + 8] for i in range(0, len(args), 8)]
            return {"tool": tool, "arguments": args, "pieces": pieces}
        if SILENT in last_user:  # a policy that ends its turn at once: no text, finished
            return {"pieces": [], "finish": "stop"}
        return _limited(body, _words(f"Here is my answer to: {last_user[:60] or 'your message'}"))

    @staticmethod
    def _tool_to_call(body: dict[str, Any], text: str) -> str | None:
        if body.get("tool_choice") == "none":
            return None
        for tool in body.get("tools") or []:
            name = (tool.get("function") or {}).get("name")
            if name and name in text:
                return str(name)
        return None

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        text = " ".join(_text_of(m.get("content")) for m in body["messages"])
        return [_token_id(p) for p in _words(text)] or [0]

    def _logprob_entries(self, pieces: list[str], top: int) -> list[dict[str, Any]]:
        entries = []
        for i, piece in enumerate(pieces):
            lp = _logprob(piece, i)
            alts = [{"token": piece, "logprob": lp, "bytes": list(piece.encode())}]
            alts += [
                {"token": f"<alt{k}>", "logprob": round(lp - 1.0 - k, 4), "bytes": None}
                for k in range(max(0, top - 1))
            ]
            entries.append(
                {
                    "token": piece,
                    "logprob": lp,
                    "bytes": list(piece.encode()),
                    "top_logprobs": alts[:top],
                }
            )
        return entries

    def _completion(self, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
        pieces = answer["pieces"]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = answer.get("finish", "stop")
        if "tool" in answer:
            message["tool_calls"] = [
                {
                    "id": "call_sim_0",
                    "type": "function",
                    "function": {"name": answer["tool"], "arguments": answer["arguments"]},
                }
            ]
            finish = "tool_calls"
        else:
            message["content"] = "".join(pieces)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": self._logprob_entries(pieces, int(body.get("top_logprobs") or 0))
            }
        result: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(self._prompt_ids(body)),
                "completion_tokens": len(pieces),
                "total_tokens": len(self._prompt_ids(body)) + len(pieces),
            },
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = [_token_id(p) for p in pieces]
            result["prompt_token_ids"] = self._prompt_ids(body)
        return result

    async def _stream(
        self, request: web.Request, body: dict[str, Any], answer: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        ident = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        created = int(time.time())
        pieces = answer["pieces"]
        top = int(body.get("top_logprobs") or 0)
        entries = self._logprob_entries(pieces, top) if body.get("logprobs") else None
        ids = body.get("return_token_ids")

        def chunk(delta: dict[str, Any], i: int | None, finish: str | None) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if entries is not None and i is not None:
                choice["logprobs"] = {"content": [entries[i]]}
            if ids and i is not None:
                choice["token_ids"] = [_token_id(pieces[i])]
            data: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": MODEL,
                "choices": [choice],
            }
            if ids and i == 0:
                data["prompt_token_ids"] = self._prompt_ids(body)
            return b"data: " + orjson.dumps(data) + b"\n\n"

        delay = self.config.token_delay_ms / 1000
        deltas, finish = _stream_deltas(answer)
        for delta, i in deltas:
            await response.write(chunk(delta, i, None))
            if delay and i is not None:
                await asyncio.sleep(delay)
        await response.write(chunk({}, None, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = _usage_chunk(ident, created, len(self._prompt_ids(body)), len(pieces))
            await response.write(b"data: " + orjson.dumps(usage) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def sim_requests(self, _request: web.Request) -> web.Response:
        return web.json_response({"chat_calls": self.chat_calls, "requests": self.requests})

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "simulator": True, "version": self.version})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/sim/updates", self.updates)
        app.router.add_get("/sim/requests", self.sim_requests)
        app.router.add_get("/health", self.health)
        return app


def _limited(body: dict[str, Any], pieces: list[str]) -> dict[str, Any]:
    """An answer in words, cut to the request's ``max_tokens`` (finish reason ``length``)."""
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and limit < len(pieces):
        return {"pieces": pieces[:limit], "finish": "length"}
    return {"pieces": pieces, "finish": "stop"}


def _stream_deltas(answer: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], int | None]], str]:
    """The deltas that stream ``answer``, each with the index of the token it carries (None: a
    tool call's head, which carries none), and the finish reason of its last chunk."""
    pieces = answer["pieces"]
    if "tool" in answer:
        head = {
            "role": "assistant",
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_sim_0",
                    "type": "function",
                    "function": {"name": answer["tool"], "arguments": ""},
                }
            ],
        }
        arguments: list[tuple[dict[str, Any], int | None]] = [
            ({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, i)
            for i, piece in enumerate(pieces)
        ]
        return [(head, None), *arguments], "tool_calls"
    deltas: list[tuple[dict[str, Any], int | None]] = []
    for i, piece in enumerate(pieces):
        delta: dict[str, Any] = {"content": piece}
        if i == 0:
            delta["role"] = "assistant"
        deltas.append((delta, i))
    return deltas, answer.get("finish", "stop")


def _usage_chunk(ident: str, created: int, prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk of a stream asked for with ``stream_options.include_usage``."""
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": status}}, status=status
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Policy-server simulator (a test double; it runs no model)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30020)
    parser.add_argument("--fail-first", type=int, default=0, help="weight updates to fail first")
    parser.add_argument(
        "--chat-fail-first", type=int, default=0, help="chat requests to answer 500 first"
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="before the first token")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="between tokens")
    args = parser.parse_args()
    config = PolicySimConfig(
        fail_first=args.fail_first,
        chat_fail_first=args.chat_fail_first,
        latency_ms=args.latency_ms,
        token_delay_ms=args.token_delay_ms,
    )
    web.run_app(PolicySimulator(config).app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
