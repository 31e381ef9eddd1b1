"""OPD and combine modes: hints, teacher prompts and teacher log-probs over real HTTP."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from aiohttp.test_utils import TestServer

from pipeline.events import Paired, Turn, decode_input
from pipeline.scoring.judge.client import JudgeClient, JudgeConfig
from pipeline.scoring.score import HttpJudge, judge_identity, score_pair
from pipeline.scoring.teacher import HINT_MARKER, PolicyTokenizer, Teacher, with_hint
from pipeline.testing.judge_sim import JudgeSimulator, SimConfig


def test_hint_goes_to_the_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "second"},
        {"role": "tool", "content": "t"},
    ]
    out = with_hint(messages, "Check the path.")
    assert out[3]["content"] == f"second\n\n{HINT_MARKER}\nCheck the path."
    assert out[1]["content"] == "first" and messages[3]["content"] == "second"
    no_user = with_hint([{"role": "system", "content": "s"}], "h")
    assert no_user[0]["content"].endswith(f"{HINT_MARKER}\nh")
    parts = with_hint([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "h")
    assert parts[0]["content"][-1] == {"type": "text", "text": f"\n\n{HINT_MARKER}\nh"}


def paired(response_ids: list[int] | None = None) -> Paired:
    turn = decode_input(
        orjson.dumps(
            {
                "type": "turn",
                "session_id": "s",
                "turn_index": 0,
                "turn_type": "main",
                "messages": [{"role": "user", "content": "How many lines does main.py have?"}],
                "response": {"content": "main.py is about 50 lines long."},
                "ts": 1.0,
                "response_ids": response_ids,
                "response_logprobs": [-0.5] * len(response_ids) if response_ids else None,
            }
        )
    )
    assert isinstance(turn, Turn)
    return Paired(
        sample_id="s:0",
        turn=turn,
        first_judged=True,
        paired_ts=2.0,
        next_state={"role": "user", "content": "Wrong: it has 214 lines."},
    )  # type: ignore[arg-type]


async def run(mode: str, tokenizer: Path, response_ids=None, **sim):  # type: ignore[no-untyped-def]
    server = TestServer(JudgeSimulator(SimConfig(**sim)).app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            judge = HttpJudge(client, judge_identity("sglang", "sim", [url]), m=3)
            teacher = Teacher(client, PolicyTokenizer(tokenizer))
            return await score_pair(paired(response_ids), judge, mode, teacher)  # type: ignore[arg-type]
    finally:
        await server.close()


async def test_opd_sample_carries_hint_and_teacher_logprobs(tiny_tokenizer: Path) -> None:
    sample = await run(
        "opd", tiny_tokenizer, response_ids=[5, 6, 7, 8], agreement=1.0, vote_dist={1: 1.0}
    )
    assert sample.hint and len(sample.hint) > 10
    assert sample.teacher_logprobs is not None and len(sample.teacher_logprobs) == 4
    assert all(lp < 0 for lp in sample.teacher_logprobs)
    assert (sample.loss_mask, sample.exclude_reason, sample.votes) == (1, None, [1])


async def test_opd_tokenises_a_response_without_ids(tiny_tokenizer: Path) -> None:
    sample = await run("opd", tiny_tokenizer, agreement=1.0, vote_dist={1: 1.0})
    tok = PolicyTokenizer(tiny_tokenizer).tok
    expected = len(tok.encode("main.py is about 50 lines long.", add_special_tokens=False))
    assert sample.teacher_logprobs is not None and len(sample.teacher_logprobs) == expected


async def test_opd_without_a_hint_is_excluded(tiny_tokenizer: Path) -> None:
    sample = await run("opd", tiny_tokenizer, agreement=1.0, vote_dist={-1: 1.0})
    assert (sample.hint, sample.teacher_logprobs) == (None, None)
    assert (sample.loss_mask, sample.exclude_reason) == (0, "no_hint")


async def test_combine_has_eval_votes_hint_and_teacher(tiny_tokenizer: Path) -> None:
    sample = await run(
        "combine", tiny_tokenizer, response_ids=[9, 10], agreement=1.0, vote_dist={1: 1.0}
    )
    assert sample.votes == [1, 1, 1] and sample.score == 1.0
    assert sample.judge_calls == 4  # 3 eval votes + 1 hint vote
    assert sample.hint and sample.teacher_logprobs is not None
    assert len(sample.teacher_logprobs) == 2


def test_opd_needs_sglang_and_a_policy_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.errors import ConfigError
    from pipeline.scoring.app import build_judge
    from pipeline.settings import ScoringSettings, Settings

    openai = Settings(
        scoring=ScoringSettings(judge="openai", judge_urls=["http://127.0.0.1:9"], mode="opd")
    )
    with pytest.raises(ConfigError, match="use --judge sglang"):
        build_judge(openai)
    no_tok = Settings(
        scoring=ScoringSettings(judge="sglang", judge_urls=["http://127.0.0.1:9"], mode="combine")
    )
    with pytest.raises(ConfigError, match="TURNSTREAM_SCORING_POLICY_TOKENIZER"):
        build_judge(no_tok)


async def test_top_k_teacher_logprobs_are_kept_per_token(tiny_tokenizer: Path) -> None:
    server = TestServer(
        JudgeSimulator(SimConfig(agreement=1.0, vote_dist={1: 1.0})).app(), host="127.0.0.1"
    )
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            judge = HttpJudge(client, judge_identity("sglang", "sim", [url]))
            teacher = Teacher(client, PolicyTokenizer(tiny_tokenizer), top_k=3)
            sample = await score_pair(paired([4, 5, 6]), judge, "opd", teacher)
    finally:
        await server.close()
    assert sample.teacher_top_logprobs is not None and len(sample.teacher_top_logprobs) == 3
    assert all(len(position) == 3 for position in sample.teacher_top_logprobs)
    assert all(
        lp < 0 and isinstance(tid, int) for p in sample.teacher_top_logprobs for lp, tid in p
    )


def test_sglang_prompts_use_the_judge_tokenizer_chat_template(tiny_tokenizer: Path) -> None:
    from pipeline.scoring.app import build_judge
    from pipeline.settings import ScoringSettings, Settings

    settings = Settings(
        scoring=ScoringSettings(
            judge="sglang", judge_urls=["http://127.0.0.1:9"], judge_tokenizer=tiny_tokenizer
        )
    )
    judge, teacher = build_judge(settings)
    assert teacher is None
    text = judge.client.render(
        [
            {"role": "system", "content": "S"},  # type: ignore[attr-defined]
            {"role": "user", "content": "U"},
        ]
    )
    assert (
        text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_simulator_latency_distributions() -> None:
    sim = JudgeSimulator(SimConfig(latency_ms=100, latency_dist="exponential", seed=1))
    draws = [sim.latency_ms() for _ in range(4000)]
    assert 90 < sum(draws) / len(draws) < 110 and max(draws) > 300
    uniform = JudgeSimulator(SimConfig(latency_ms=100, latency_jitter_ms=20))
    assert all(80 <= uniform.latency_ms() <= 120 for _ in range(1000))
