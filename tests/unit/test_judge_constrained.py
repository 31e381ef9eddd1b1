"""Regex-constrained votes: what the judge client sends, and when (on, off, auto)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.judge.asking import eval_votes, hint_votes
from pipeline.judge.client import JudgeClient, JudgeConfig
from pipeline.judge.prompts import eval_regex, hint_regex


class Recorder:
    """A minimal SGLang-shaped server: /generate answers a box per output, bodies recorded."""

    def __init__(self, model_info: dict[str, Any] | None) -> None:
        self.model_info = model_info
        self.bodies: list[dict[str, Any]] = []
        self.info_calls = 0

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
        n = body["sampling_params"].get("n", 1)
        hint = "HINT_START" in str(body["sampling_params"].get("regex", ""))
        out = "\\boxed{1} [HINT_START]Say Canberra.[HINT_END]" if hint else "\\boxed{-1}"
        answers = [{"text": out, "meta_info": {}} for _ in range(len(texts) * n)]
        return web.json_response(answers if len(answers) > 1 else answers[0])

    async def info(self, _request: web.Request) -> web.Response:
        self.info_calls += 1
        if self.model_info is None:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        return web.json_response(self.model_info)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/get_model_info", self.info)
        return app


async def serve(recorder: Recorder) -> tuple[TestServer, str]:
    server = TestServer(recorder.app(), host="127.0.0.1")
    await server.start_server()
    return server, str(server.make_url("")).rstrip("/")


def regexes(recorder: Recorder) -> list[str | None]:
    return [b["sampling_params"].get("regex") for b in recorder.bodies]


@pytest.mark.parametrize(
    ("setting", "model_info", "constrained"),
    [
        ("on", None, True),
        ("off", {"turnstream_judge": {"base": "x"}}, False),
        ("auto", {"turnstream_judge": {"base": "smollm2-135m-instruct"}}, True),
        ("auto", {"turnstream_judge": None, "model_path": "/m"}, False),  # our serve, no judge
        ("auto", None, False),  # a server without model info (404)
    ],
)
async def test_votes_carry_the_regex_when_constrained(
    setting: str, model_info: dict[str, Any] | None, constrained: bool
) -> None:
    recorder = Recorder(model_info)
    server, url = await serve(recorder)
    try:
        config = JudgeConfig(backend="sglang", urls=[url], constrained=setting)  # type: ignore[arg-type]
        async with JudgeClient(config) as client:
            ev = await eval_votes(client, "Sydney.", "user", "No, it is Canberra.", m=3)
            await eval_votes(client, "Sydney.", "user", "No, it is Canberra.", m=3)
    finally:
        await server.close()
    assert ev.votes == [-1, -1, -1]
    assert regexes(recorder) == [eval_regex() if constrained else None] * 2
    assert all(b["sampling_params"]["n"] == 3 for b in recorder.bodies)  # one request a pair
    assert recorder.info_calls == (1 if setting == "auto" else 0)  # asked once, then kept
    assert client.requests == 2  # the model-info query is no judge call


async def test_eval_and_hint_votes_asked_together_are_not_batched_together() -> None:
    recorder = Recorder(None)
    server, url = await serve(recorder)
    try:
        config = JudgeConfig(
            backend="sglang", urls=[url], constrained="on", max_new_tokens=64,
            hint_max_new_tokens=64, reason_chars=40,
        )  # fmt: skip
        async with JudgeClient(config) as client:
            ev, hi = await asyncio.gather(
                eval_votes(client, "a", "user", "No.", m=1),
                hint_votes(client, "a", "user", "No.", m=1),
            )
    finally:
        await server.close()
    assert sorted(map(str, regexes(recorder))) == sorted([eval_regex(40), hint_regex(40)])
    assert ev.votes == [-1] and hi.hint == "Say Canberra."


def test_the_regexes_admit_what_the_worker_parses_and_nothing_else() -> None:
    ev, hi = eval_regex(20), hint_regex(20)
    assert re.fullmatch(ev, "\\boxed{0}") and re.fullmatch(ev, "A correction. \\boxed{-1}")
    assert not re.fullmatch(ev, "x" * 21 + "\\boxed{1}")  # the reason is bounded
    assert not re.fullmatch(ev, "\\boxed{1} more") and not re.fullmatch(ev, "\\boxed{2}")
    assert re.fullmatch(hi, "\\boxed{-1}")
    assert re.fullmatch(hi, "\\boxed{1} [HINT_START]Answer Canberra, not Sydney.[HINT_END]")
    assert not re.fullmatch(hi, "\\boxed{1}")  # +1 needs its hint
    assert not re.fullmatch(hi, "\\boxed{1} [HINT_START]short[HINT_END]")  # 10 chars at least
