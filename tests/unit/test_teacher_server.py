"""The OPD teacher on a server of its own (TURNSTREAM_SCORING_TEACHER_URLS): any judge's hints,
the served policy's log-probs under the hinted prompt, and answers cut short asked again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.backoff import RetryPolicy
from pipeline.errors import ConfigError, TurnstreamError
from pipeline.events import Paired, Turn, decode_input
from pipeline.judge.client import JudgeClient, JudgeConfig, JudgeUnavailable
from pipeline.judge.factory import build_judge
from pipeline.judge.rules import RulesJudge
from pipeline.judge.teacher import NEUTRAL_HINT, PolicyTokenizer, Teacher
from pipeline.scoring.scorers import PrmScorer, score_pair
from pipeline.settings import ScoringSettings, Settings, load_settings
from tests.servers import embedded_server, make_tiny_policy, post

FAST = RetryPolicy(max_attempts=3, initial_delay_s=0.0, max_delay_s=0.0)
HINT = "The user said afterwards: Wrong: it has 214 lines."


def paired(reply: str, session: str = "s") -> Paired:
    turn = decode_input(
        orjson.dumps(
            {
                "type": "turn",
                "session_id": session,
                "turn_index": 0,
                "turn_type": "main",
                "messages": [{"role": "user", "content": "How many lines does main.py have?"}],
                "response": {"content": "main.py is about 50 lines long."},
                "ts": 1.0,
            }
        )
    )
    assert isinstance(turn, Turn)
    return Paired(
        sample_id=f"{session}:0",
        turn=turn,
        first_judged=True,
        paired_ts=2.0,
        next_state={"role": "user", "content": reply},
    )  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> tuple[Path, Path]:
    """Version 0 and a perturbed version 1 of one tiny policy, named like trainer pushes."""
    root = tmp_path_factory.mktemp("policies")
    first = make_tiny_policy(root / "v000000", tiny_tokenizer, seed=5)
    second = make_tiny_policy(root / "v000001", tiny_tokenizer, seed=5, noise=0.05)
    return first, second


@pytest.fixture
def served(policies: tuple[Path, Path]) -> Iterator[str]:
    with embedded_server(policies[0], context_length=256, max_running_requests=8) as (url, _s):
        yield url


def forced_logprobs(policy: Path, input_ids: list[int], n: int) -> list[float]:
    """The last ``n`` tokens' log-probs under ``policy``, computed here with transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([input_ids])).logits[0, :-1]
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(input_ids[1:])[:, None])
    return picked.flatten()[-n:].tolist()


def teacher_settings(tokenizer: Path, **scoring: Any) -> Settings:
    fields = {"mode": "opd", "policy_tokenizer": tokenizer, **scoring}
    return Settings(scoring=ScoringSettings(**fields))


def test_a_teacher_server_of_its_own_is_read_from_the_environment_and_checked(
    monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Path
) -> None:
    monkeypatch.setenv("TURNSTREAM_SCORING_MODE", "combine")
    monkeypatch.setenv("TURNSTREAM_SCORING_JUDGE", "openai")
    monkeypatch.setenv("TURNSTREAM_SCORING_JUDGE_URLS", "http://judge:1")
    with pytest.raises(ConfigError, match=r"set TURNSTREAM_SCORING_TEACHER_URLS \(--teacher-url\)"):
        load_settings()
    monkeypatch.setenv("TURNSTREAM_SCORING_TEACHER_URLS", "http://policy:1, http://policy:2")
    with pytest.raises(ConfigError, match="needs TURNSTREAM_SCORING_POLICY_TOKENIZER"):
        load_settings()
    monkeypatch.setenv("TURNSTREAM_SCORING_POLICY_TOKENIZER", str(tiny_tokenizer))
    scoring = load_settings().scoring
    assert scoring.teacher_urls == ["http://policy:1", "http://policy:2"]
    monkeypatch.setenv("TURNSTREAM_SCORING_JUDGE", "rules")  # hints from the rules judge
    assert load_settings().scoring.judge == "rules"


def test_the_teacher_asks_its_own_servers_and_else_the_sglang_judges(tiny_tokenizer: Path) -> None:
    judge, teacher = build_judge(teacher_settings(tiny_tokenizer, teacher_urls=["http://t:1"]))
    assert isinstance(judge, RulesJudge) and teacher is not None
    assert teacher.client.config.urls == ["http://t:1"]
    assert teacher.client.config.role == "teacher" and teacher.client.config.backend == "sglang"
    http = {"judge": "openai", "judge_urls": ["http://j:1"], "teacher_urls": ["http://t:1"]}
    judge, teacher = build_judge(teacher_settings(tiny_tokenizer, **http))
    assert teacher is not None and teacher.client is not judge.client  # type: ignore[attr-defined]
    assert teacher.client.config.urls == ["http://t:1"]
    sglang = {"judge": "sglang", "judge_urls": ["http://j:1"]}
    judge, teacher = build_judge(teacher_settings(tiny_tokenizer, **sglang))
    assert teacher is not None and teacher.client is judge.client  # type: ignore[attr-defined]
    _judge, teacher = build_judge(teacher_settings(tiny_tokenizer, mode="rl", teacher_urls=["x"]))
    assert teacher is None  # rl has no teacher
    _judge, teacher = build_judge(teacher_settings(tiny_tokenizer))
    assert teacher is None  # the rules judge alone: hints, no log-probs (as before)


async def test_a_rules_hint_is_taught_by_the_served_policy_under_the_hinted_prompt(
    served: str, policies: tuple[Path, Path], tiny_tokenizer: Path
) -> None:
    """The hint the rules judge takes from a correction goes to the last user message; the
    served policy's log-probs of the response under that prompt are the sample's, and a
    thanks (no hint) asks the teacher nothing and is dropped as no_hint."""
    tokenizer = PolicyTokenizer(tiny_tokenizer)
    async with JudgeClient(JudgeConfig(backend="sglang", urls=[served], role="teacher")) as client:
        teacher = Teacher(client, tokenizer)
        corrected = await score_pair(
            paired("Wrong: it has 214 lines."), RulesJudge(), "opd", teacher
        )
        asked = client.requests
        thanked = await score_pair(paired("Thanks, perfect!", "t"), RulesJudge(), "opd", teacher)
    assert (corrected.hint, corrected.loss_mask, corrected.exclude_reason) == (HINT, 1, None)
    turn = paired("x").turn
    input_ids, n = tokenizer.teacher_input(turn, HINT)
    expected = forced_logprobs(policies[0], input_ids, n)
    assert corrected.teacher_logprobs == pytest.approx(expected, abs=1e-4)
    other, _n = tokenizer.teacher_input(turn, "Something else entirely.")  # the hint matters
    assert forced_logprobs(policies[0], other, n) != pytest.approx(expected, abs=1e-4)
    assert (thanked.loss_mask, thanked.exclude_reason, thanked.teacher_logprobs) == (
        0,
        "no_hint",
        None,
    )
    assert asked == 1 and client.requests == 1


async def test_teacher_calls_during_weight_pushes_get_one_versions_logprobs(
    served: str, policies: tuple[Path, Path], tiny_tokenizer: Path
) -> None:
    """The served policy is both the rollout server and the teacher: while pushes swap its
    weights back and forth, every teacher answer is exactly version 0's or version 1's
    log-probs (a request runs on the weights it was admitted with), and none fails."""
    tokenizer = PolicyTokenizer(tiny_tokenizer)
    input_ids, n = tokenizer.teacher_input(paired("x").turn, HINT)
    references = [forced_logprobs(p, input_ids, n) for p in policies]
    pushed: list[int] = []

    def push_back_and_forth() -> None:
        for i in range(6):
            status, body = post(served + "/update_weights_from_disk",
                                {"model_path": str(policies[(i + 1) % 2])})  # fmt: skip
            pushed.append(status if body["success"] else -status)

    pusher = threading.Thread(target=push_back_and_forth)
    async with JudgeClient(JudgeConfig(backend="sglang", urls=[served], role="teacher")) as client:
        teacher = Teacher(client, tokenizer)
        pusher.start()
        answers = []
        while pusher.is_alive() or len(answers) < 8:
            answers += await asyncio.gather(*(teacher.logprobs(paired("x").turn, HINT)
                                              for _ in range(4)))  # fmt: skip
        pusher.join()
        last = await teacher.logprobs(paired("x").turn, HINT)  # after the last push, of v0
    assert pushed == [200] * 6 and client.retries == 0
    for answer in answers:
        matches = [v for v, ref in enumerate(references)
                   if answer.logprobs == pytest.approx(ref, abs=1e-4)]  # fmt: skip
        assert len(matches) == 1, answer.logprobs
    assert last.logprobs == pytest.approx(references[0], abs=1e-4)
    assert references[0] != pytest.approx(references[1], abs=1e-3)  # the versions differ


def scripted_teacher(answers: list[Any]) -> web.Application:
    """A /generate that gives ``answers`` in turn (a dict: 200 JSON; an int: that status)."""
    calls = iter(answers)

    async def generate(_request: web.Request) -> web.Response:
        answer = next(calls)
        if isinstance(answer, int):
            return web.json_response({"error": "busy"}, status=answer)
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


def logprob_answer(values: list[float], finish: dict[str, Any] | None = None) -> dict[str, Any]:
    entries = [[None, 1, None], *([v, 2, None] for v in values)]
    meta = {"input_token_logprobs": entries, "finish_reason": finish or {"type": "length"}}
    return {"text": "", "meta_info": meta}


ABORTED = {
    "text": "",
    "meta_info": {"finish_reason": {"type": "abort", "message": "weights are being updated"}},
}


@pytest.fixture
async def teacher_at() -> Any:
    servers: list[TestServer] = []

    async def start(answers: list[Any]) -> JudgeClient:
        server = TestServer(scripted_teacher(answers), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        url = str(server.make_url("")).rstrip("/")
        return JudgeClient(JudgeConfig(backend="sglang", urls=[url], retry=FAST, role="teacher"))

    yield start
    for server in servers:
        await server.close()


async def test_an_aborted_or_busy_teacher_answer_is_asked_again_never_taken(teacher_at) -> None:  # type: ignore[no-untyped-def]
    """SGLang answers a request that a weight update aborted with 200 and finish_reason
    abort, its log-probs partial or missing: the call is tried again, like a 503."""
    partial = logprob_answer([-9.0], {"type": "abort", "message": "update_weights"})
    client = await teacher_at([ABORTED, 503, partial, logprob_answer([-0.5, -1.5])])
    async with client:
        with pytest.raises(JudgeUnavailable, match=r"teacher unreachable after 3 attempts.*abort"):
            await client.teacher_logprobs([1, 2, 3, 4], response_len=2)
        out = await client.teacher_logprobs([1, 2, 3, 4], response_len=2)
    assert out["logprobs"] == [-0.5, -1.5] and client.retries == 2


async def test_a_pair_whose_teacher_stays_cut_short_goes_to_retry(  # type: ignore[no-untyped-def]
    teacher_at, tiny_tokenizer: Path
) -> None:
    client = await teacher_at([ABORTED] * 3)
    async with client:
        teacher = Teacher(client, PolicyTokenizer(tiny_tokenizer))
        with pytest.raises(JudgeUnavailable, match="aborted the request"):
            await score_pair(paired("Wrong: it has 214 lines."), RulesJudge(), "opd", teacher)


async def test_a_server_that_gives_no_prompt_logprobs_is_an_error_that_says_so(teacher_at) -> None:  # type: ignore[no-untyped-def]
    client = await teacher_at([{"text": "", "meta_info": {"finish_reason": {"type": "length"}}}])
    async with client:
        with pytest.raises(TurnstreamError, match="without input_token_logprobs") as caught:
            await client.teacher_logprobs([1, 2, 3], response_len=1)
    assert not isinstance(caught.value, JudgeUnavailable) and client.retries == 0


async def test_the_scorer_closes_a_teacher_client_of_its_own_and_a_shared_one_once(
    tiny_tokenizer: Path,
) -> None:
    closed: list[str] = []

    class Client(JudgeClient):
        async def close(self) -> None:
            closed.append(self.config.role)

    tok = PolicyTokenizer(tiny_tokenizer)
    own = Client(JudgeConfig(backend="sglang", urls=["http://t:1"], role="teacher"))
    await PrmScorer(RulesJudge(), "opd", Teacher(own, tok)).close()
    assert closed == ["teacher"]
    settings = teacher_settings(tiny_tokenizer, judge="sglang", judge_urls=["http://j:1"])
    judge, _teacher = build_judge(settings)
    shared = Client(JudgeConfig(backend="sglang", urls=["http://j:1"]))
    judge.client = shared  # type: ignore[attr-defined]
    await PrmScorer(judge, "opd", Teacher(shared, tok)).close()
    assert closed == ["teacher", "judge"]


async def test_a_contrastive_teacher_is_also_asked_with_the_neutral_line(
    served: str, policies: tuple[Path, Path], tiny_tokenizer: Path
) -> None:
    """teacher_contrast: the response's log-probs under the hinted prompt and, asked at the
    same time, under the prompt with the neutral line in the hint's place."""
    tokenizer = PolicyTokenizer(tiny_tokenizer)
    async with JudgeClient(JudgeConfig(backend="sglang", urls=[served], role="teacher")) as client:
        teacher = Teacher(client, tokenizer, contrast=True)
        sample = await score_pair(paired("Wrong: it has 214 lines."), RulesJudge(), "opd", teacher)
        assert client.requests == 2
    turn = paired("x").turn
    hinted, n = tokenizer.teacher_input(turn, HINT)
    neutral, _n = tokenizer.teacher_input(turn, NEUTRAL_HINT)
    assert sample.teacher_logprobs == pytest.approx(
        forced_logprobs(policies[0], hinted, n), abs=1e-4
    )
    assert sample.teacher_neutral_logprobs == pytest.approx(
        forced_logprobs(policies[0], neutral, n), abs=1e-4
    )
    assert sample.teacher_neutral_logprobs != pytest.approx(sample.teacher_logprobs, abs=1e-4)
    _judge, built = build_judge(
        teacher_settings(tiny_tokenizer, teacher_urls=["http://t:1"], teacher_contrast=True)
    )
    assert built is not None and built.contrast
