"""The judge clients and vote runners against the judge simulator over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY

from pipeline.backoff import RetryPolicy
from pipeline.errors import TurnstreamError
from pipeline.judge.asking import eval_votes, hint_votes
from pipeline.judge.client import JudgeClient, JudgeConfig, JudgeUnavailable
from pipeline.judge.factory import judge_client
from pipeline.settings import ScoringSettings, Settings
from pipeline.testing.judge_sim import JudgeSimulator, SimConfig

Start = Callable[..., "AsyncIterator[tuple[JudgeSimulator, str]]"]


@pytest.fixture
async def sim_factory():  # type: ignore[no-untyped-def]
    servers: list[TestServer] = []

    async def start(**overrides) -> tuple[JudgeSimulator, str]:  # type: ignore[no-untyped-def]
        sim = JudgeSimulator(SimConfig(**overrides))
        server = TestServer(sim.app(), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return sim, str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


def config(
    url: str | list[str], backend: str = "sglang", max_attempts: int = 4, **kw
) -> JudgeConfig:  # type: ignore[no-untyped-def]
    urls = [url] if isinstance(url, str) else url
    return JudgeConfig(
        backend=backend,  # type: ignore[arg-type]
        urls=urls,
        retry=RetryPolicy(max_attempts, initial_delay_s=0.01, max_delay_s=0.02, jitter=True),
        **kw,
    )


async def test_fixed_votes_make_m_calls_and_take_the_majority(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0, vote_dist={-1: 1.0})
    async with JudgeClient(config(url)) as client:
        result = await eval_votes(client, "answer", "user", "No, that's wrong.", m=3)
    assert result.votes == [-1, -1, -1] and result.score == -1.0
    assert result.judge_calls == 3 and sim.stats.calls == 3


async def test_early_stop_skips_the_third_call_when_two_agree(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0, vote_dist={1: 1.0})
    async with JudgeClient(config(url)) as client:
        result = await eval_votes(client, "answer", "tool", "exit 0", vote_mode="early_stop")
    assert result.votes == [1, 1] and result.judge_calls == 2 and result.score == 1.0
    assert sim.stats.calls == 2


async def test_early_stop_asks_a_third_vote_on_disagreement(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=0.0, vote_dist={1: 1.0}, seed=3)
    async with JudgeClient(config(url)) as client:
        for _ in range(10):
            result = await eval_votes(client, "a", "user", "b", vote_mode="early_stop")
            assert result.judge_calls == (2 if result.votes[0] == result.votes[1] else 3)
    assert sim.stats.calls > 20  # with zero agreement, some pairs disagree


async def test_malformed_outputs_are_failed_votes_not_errors(sim_factory) -> None:  # type: ignore[no-untyped-def]
    _sim, url = await sim_factory(malformed_rate=1.0)
    async with JudgeClient(config(url)) as client:
        result = await eval_votes(client, "a", "user", "b", m=3)
    assert result.votes == [None, None, None] and result.score == 0.0


def judge_retries() -> float:
    return REGISTRY.get_sample_value("turnstream_judge_request_retries_total") or 0.0


async def test_unreachable_judge_raises_after_bounded_retries(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(error_rate=1.0)
    before = judge_retries()
    async with JudgeClient(config(url, max_attempts=3)) as client:
        with pytest.raises(JudgeUnavailable, match="after 3 attempts: HTTP 503"):
            await eval_votes(client, "a", "user", "b", m=1)
        assert client.retries == 2
    assert sim.stats.calls == 3
    assert judge_retries() == before + 2  # the dashboard's retries panel


def test_the_judge_retries_as_the_settings_say() -> None:
    scoring = ScoringSettings(
        judge="sglang", judge_urls=["http://j:1"], judge_max_attempts=6, judge_backoff_max_s=2.5
    )
    retry = judge_client(Settings(scoring=scoring)).config.retry
    assert retry == RetryPolicy(6, initial_delay_s=0.5, max_delay_s=2.5, jitter=True)
    default = judge_client(Settings(scoring=ScoringSettings(judge="openai", judge_urls=["x"])))
    assert default.config.retry == JudgeConfig("sglang", ["x"]).retry  # 4 tries, up to 8 s


async def test_timeouts_are_retried_then_reported(sim_factory) -> None:  # type: ignore[no-untyped-def]
    _sim, url = await sim_factory(timeout_rate=1.0)
    async with JudgeClient(config(url, max_attempts=2, timeout_s=0.2)) as client:
        with pytest.raises(JudgeUnavailable, match=r"no answer .* within 0.2s"):
            await eval_votes(client, "a", "user", "b", m=1)


async def test_connection_refused_moves_to_the_next_replica(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0, vote_dist={1: 1.0})
    dead = "http://127.0.0.1:9"  # discard port: nothing listens there
    async with JudgeClient(config([dead, url], max_attempts=2)) as client:
        result = await eval_votes(client, "a", "user", "thanks", m=3)
    assert result.score == 1.0 and sim.stats.calls == 3


async def test_client_error_is_not_retried(sim_factory) -> None:  # type: ignore[no-untyped-def]
    _sim, url = await sim_factory()
    async with JudgeClient(config(url)) as client:
        with pytest.raises(TurnstreamError, match="answered 400"):
            await client.post("/generate", {"neither": "text nor ids"})
        assert client.retries == 0


async def test_openai_backend_asks_all_votes_in_one_request(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0, vote_dist={0: 1.0})
    async with JudgeClient(config(url, backend="openai", model="judge")) as client:
        result = await eval_votes(client, "a", "user", "ok", m=3)
    assert result.votes == [0, 0, 0] and result.judge_calls == 3 and sim.stats.calls == 1


async def test_hint_votes(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0, vote_dist={1: 1.0})
    async with JudgeClient(config(url)) as client:
        hint = await hint_votes(client, "a", "user", "wrong, redo", m=2)
    assert hint.votes == [1, 1] and hint.hint == sim.config.hint and hint.judge_calls == 2


async def test_teacher_logprobs_cover_exactly_the_response(sim_factory) -> None:  # type: ignore[no-untyped-def]
    _sim, url = await sim_factory()
    async with JudgeClient(config(url)) as client:
        out = await client.teacher_logprobs(list(range(100, 120)), response_len=5, top_k=2)
    assert len(out["logprobs"]) == 5 and all(lp < 0 for lp in out["logprobs"])
    assert len(out["top_logprobs"]) == 5 and all(len(t) == 2 for t in out["top_logprobs"])


REPLIES = [f"reply number {i}: {'no' if i % 3 else 'yes'}, see line {i * 7}" for i in range(8)]


async def test_pairs_asked_at_once_share_one_sglang_request_each_getting_its_own_votes(
    sim_factory,  # type: ignore[no-untyped-def]
) -> None:
    """SGLang's batch order (each prompt's n answers together) is kept: with votes that
    depend on the prompt only, batched votes equal the votes asked one request a pair."""
    sim, url = await sim_factory(agreement=1.0, vote_dist={1: 0.4, -1: 0.3, 0: 0.3})
    async with JudgeClient(config(url, batch_max=1)) as one_by_one:
        alone = [await eval_votes(one_by_one, "answer", "user", r, m=3) for r in REPLIES]
    assert len({a.score for a in alone}) > 1  # the replies are judged apart
    before = len(sim.bodies)
    async with JudgeClient(config(url, batch_max=3)) as client:
        batched = await asyncio.gather(
            *(eval_votes(client, "answer", "user", r, m=3) for r in REPLIES)
        )
        assert client.requests == 3
    assert [b.votes for b in batched] == [a.votes for a in alone]
    requests = [r["body"] for r in list(sim.bodies)[before:]]
    assert [len(b["text"]) if isinstance(b["text"], list) else 1 for b in requests] == [3, 3, 2]
    assert all(b["sampling_params"]["n"] == 3 for b in requests)


async def test_a_failed_batch_request_fails_every_pair_in_it(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(error_rate=1.0)
    async with JudgeClient(config(url, max_attempts=2)) as client:
        results = await asyncio.gather(
            *(eval_votes(client, "a", "user", r, m=3) for r in REPLIES[:4]),
            return_exceptions=True,
        )
        assert client.requests == 2  # one batch, tried twice
    assert [len(b["body"]["text"]) for b in sim.bodies] == [4, 4]
    assert all(isinstance(r, JudgeUnavailable) for r in results), results


async def test_a_batch_answered_with_too_few_outputs_is_an_error_for_each_pair() -> None:
    """A judge that drops an answer must not shift the votes onto the wrong pairs."""

    async def one_short(request: web.Request) -> web.Response:
        body = await request.json()
        count = len(body["text"]) * body["sampling_params"]["n"] - 1
        return web.json_response([{"text": "\\boxed{1}"}] * count)

    app = web.Application()
    app.router.add_post("/generate", one_short)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with JudgeClient(config(str(server.make_url("")).rstrip("/"))) as client:
            results = await asyncio.gather(
                *(eval_votes(client, "a", "user", r, m=3) for r in REPLIES[:2]),
                return_exceptions=True,
            )
    finally:
        await server.close()
    assert all(isinstance(r, TurnstreamError) and "5 outputs for 2 prompt(s)" in str(r)
               for r in results), results  # fmt: skip


async def test_pairs_asked_within_the_batch_wait_share_a_request(sim_factory) -> None:  # type: ignore[no-untyped-def]
    """A worker asks for its pairs one loop turn apart: the wait gathers them."""
    sim, url = await sim_factory(agreement=1.0)

    async def apart(client: JudgeClient) -> list[Any]:
        async def ask(i: int, reply: str) -> Any:
            await asyncio.sleep(0.01 * (i + 1))  # 10 ms apart
            return await eval_votes(client, "answer", "user", reply, m=3)

        return await asyncio.gather(*(ask(i, r) for i, r in enumerate(REPLIES[:4])))

    async with JudgeClient(config(url)) as no_wait:
        await apart(no_wait)
        assert no_wait.requests == 4
    before = len(sim.bodies)
    async with JudgeClient(config(url, batch_wait_s=0.1)) as waiting:
        votes = await apart(waiting)
        assert waiting.requests == 1
    assert [len(b["body"]["text"]) for b in list(sim.bodies)[before:]] == [4]
    assert all(len(v.votes) == 3 for v in votes)


async def test_a_full_batch_goes_without_waiting_out_the_batch_wait(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0)
    async with JudgeClient(config(url, batch_max=3, batch_wait_s=3600.0)) as client:
        asked = asyncio.gather(*(eval_votes(client, "answer", "user", r, m=3) for r in REPLIES[:3]))
        first = await asyncio.wait_for(asked, timeout=60)  # a wait for the hour would fail here
        assert client.requests == 1 and len(first) == 3
    assert [len(b["body"]["text"]) for b in sim.bodies] == [3]


async def test_the_batch_after_a_full_one_waits_for_its_own_timer(
    sim_factory,  # type: ignore[no-untyped-def]
) -> None:
    sim, url = await sim_factory(agreement=1.0)
    async with JudgeClient(config(url, batch_max=3, batch_wait_s=0.2)) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await asyncio.gather(
            *(eval_votes(client, "answer", "user", r, m=3) for r in REPLIES[:3])
        )
        full_after = loop.time() - started
        await asyncio.sleep(max(0.0, 0.1 - full_after))
        late = asyncio.ensure_future(eval_votes(client, "answer", "user", REPLIES[3], m=3))
        await asyncio.sleep(0.15)  # past the full batch's timer (0.2), before the late one's
        assert not late.done()
        await late
        assert client.requests == 2
    assert len(first) == 3
    texts = [b["body"]["text"] for b in sim.bodies]
    assert [len(t) if isinstance(t, list) else 1 for t in texts] == [3, 1]


async def test_closing_the_client_drops_a_batch_still_waiting(sim_factory) -> None:  # type: ignore[no-untyped-def]
    sim, url = await sim_factory(agreement=1.0)
    client = JudgeClient(config(url, batch_wait_s=0.2))
    waiting = asyncio.ensure_future(eval_votes(client, "answer", "user", REPLIES[0], m=3))
    await asyncio.sleep(0.05)
    await client.close()
    # The end marker: a batch asked after the close, with the same wait, goes after the
    # dropped one's timer would have fired; once it is answered, nothing else went out.
    async with JudgeClient(config(url, batch_wait_s=0.2)) as marker:
        await eval_votes(marker, "answer", "user", "the marker", m=3)
    assert waiting.cancelled()
    bodies = [str(b["body"]["text"]) for b in sim.bodies]
    assert len(bodies) == 1 and "the marker" in bodies[0] and REPLIES[0] not in bodies[0]
