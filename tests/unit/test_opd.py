"""OPD and combine modes: hints, teacher prompts and teacher log-probs over real HTTP."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import torch
from aiohttp.test_utils import TestServer

from pipeline.events import JudgeIdentity, Paired, Sample, Turn, decode_as, decode_input
from pipeline.judge.asking import HttpJudge
from pipeline.judge.client import JudgeClient, JudgeConfig
from pipeline.judge.factory import judge_identity
from pipeline.judge.teacher import HINT_MARKER, PolicyTokenizer, Teacher, TeacherOutput, with_hint
from pipeline.judge.votes import EvalResult, HintResult
from pipeline.scoring.samples import build_sample
from pipeline.scoring.scorers import score_pair
from pipeline.testing.judge_sim import JudgeSimulator, SimConfig
from pipeline.training.batch import collate, tokenize_sample


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


TOOL_CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "count_lines", "arguments": '{"path": "main.py"}'},
}


def paired(response_ids: list[int] | None = None, response: dict[str, Any] | None = None) -> Paired:
    turn = decode_input(
        orjson.dumps(
            {
                "type": "turn",
                "session_id": "s",
                "turn_index": 0,
                "turn_type": "main",
                "messages": [{"role": "user", "content": "How many lines does main.py have?"}],
                "response": response or {"content": "main.py is about 50 lines long."},
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


async def run(mode: str, tokenizer: Path, response_ids=None, response=None, **sim):  # type: ignore[no-untyped-def]
    sample, _bodies = await run_recorded(mode, tokenizer, response_ids, response, **sim)
    return sample


async def run_recorded(  # type: ignore[no-untyped-def]
    mode: str, tokenizer: Path, response_ids=None, response=None, **sim
) -> tuple[Sample, list[dict[str, Any]]]:
    """Score one pair against the simulator; also what reached it (GET /sim/requests)."""
    server = TestServer(JudgeSimulator(SimConfig(**sim)).app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            judge = HttpJudge(client, judge_identity("sglang", "sim", [url]), m=3)
            teacher = Teacher(client, PolicyTokenizer(tokenizer))
            pair = paired(response_ids, response)
            sample = await score_pair(pair, judge, mode, teacher)  # type: ignore[arg-type]
        async with aiohttp.ClientSession() as http, http.get(url + "/sim/requests") as resp:
            bodies = await resp.json()
        return sample, bodies
    finally:
        await server.close()


def teacher_requests(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b["body"] for b in bodies if "input_ids" in b["body"]]


async def test_opd_sample_carries_hint_and_teacher_logprobs(tiny_tokenizer: Path) -> None:
    sample = await run(
        "opd", tiny_tokenizer, response_ids=[5, 6, 7, 8], agreement=1.0, vote_dist={1: 1.0}
    )
    assert sample.hint and len(sample.hint) > 10
    # the four ids the engine generated and the end-of-turn token they lacked
    assert sample.teacher_logprobs is not None and len(sample.teacher_logprobs) == 5
    assert all(lp < 0 for lp in sample.teacher_logprobs)
    assert (sample.loss_mask, sample.exclude_reason, sample.votes) == (1, None, [1])


async def test_the_teacher_scores_exactly_the_tokens_that_train(tiny_tokenizer: Path) -> None:
    sample, bodies = await run_recorded("opd", tiny_tokenizer, agreement=1.0, vote_dist={1: 1.0})
    tok = PolicyTokenizer(tiny_tokenizer).tok
    trained = tokenize_sample(sample, tok, max_seq_len=4096)
    assert tok.decode(trained.response_ids) == "main.py is about 50 lines long.<|im_end|>"
    assert sample.teacher_logprobs == trained.teacher_logprobs and not trained.teacher_misaligned
    [body] = teacher_requests(bodies)
    # asked from the position before the response: SGLang returns None for the first one
    start = body["logprob_start_len"] + 1
    assert body["input_ids"][start:] == trained.response_ids  # end-of-turn token included


async def test_the_hinted_prompt_is_what_reaches_the_teacher(tiny_tokenizer: Path) -> None:
    sample, bodies = await run_recorded("opd", tiny_tokenizer, agreement=1.0, vote_dist={1: 1.0})
    [body] = teacher_requests(bodies)
    tok = PolicyTokenizer(tiny_tokenizer).tok
    prompt = tok.decode(body["input_ids"][: body["logprob_start_len"] + 1])
    hint = SimConfig().hint
    assert sample.hint == hint
    expected = (
        "<|im_start|>user\nHow many lines does main.py have?\n\n"
        f"{HINT_MARKER}\n{hint}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt == expected
    hint_votes = [b for b in bodies if "text" in b["body"] and "[HINT_START]" in b["body"]["text"]]
    assert len(hint_votes) == 1 and HINT_MARKER not in hint_votes[0]["body"]["text"]


async def test_a_tool_call_only_turn_trains_in_opd_with_aligned_advantages(
    tiny_tokenizer: Path,
) -> None:
    from pipeline.training.config import TrainerConfig
    from pipeline.training.engine import PolicyEngine
    from pipeline.training.losses import sample_advantages

    response = {"content": None, "tool_calls": [TOOL_CALL]}
    sample = await run("opd", tiny_tokenizer, response=response, agreement=1.0, vote_dist={1: 1.0})
    tok = PolicyTokenizer(tiny_tokenizer).tok
    t = tokenize_sample(sample, tok, max_seq_len=4096)
    assert tok.decode(t.response_ids).startswith("<tool_call>count_lines(")
    assert t.teacher_logprobs is not None and len(t.teacher_logprobs) == len(t.response_ids)
    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    tiny |= {"num_attention_heads": 2, "num_key_value_heads": 1}
    eng = PolicyEngine(TrainerConfig(mode="opd", lr=1e-2, tiny_model=tiny), vocab_size=len(tok))
    mb = collate([t], pad_id=tok.pad_token_id)
    old = eng.logprobs(mb)
    adv = sample_advantages(
        "opd", mb.rewards, mb.teacher_logprobs, mb.has_teacher, old, mb.response_mask
    )
    positions = mb.response_mask[0].nonzero().flatten()
    assert torch.isfinite(adv).all()
    expected = torch.tensor(t.teacher_logprobs) - old[0, positions]
    assert torch.allclose(adv[0, positions], expected)  # teacher - old, token by token
    assert (adv[0] != 0).sum() == len(t.response_ids)  # every response token, nothing else
    before = eng.parameters_snapshot()
    stats = eng.train_step([mb])
    assert math.isfinite(stats.loss) and stats.pg_loss == pytest.approx(
        -float(expected.mean()), abs=1e-5
    )
    assert any(
        not torch.equal(a, b) for a, b in zip(before, eng.parameters_snapshot(), strict=True)
    )


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
    assert len(sample.teacher_logprobs) == 3  # the two ids and the end-of-turn token


async def test_combine_asks_eval_and_hint_votes_at_the_same_time() -> None:
    # each call lasts long beside any scheduling delay of a loaded machine: calls asked
    # together are in flight together (benchmarks/overlap.py times it)
    sim = JudgeSimulator(SimConfig(agreement=1.0, vote_dist={1: 1.0}, latency_ms=1000))
    server = TestServer(sim.app(), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            judge = HttpJudge(client, judge_identity("sglang", "sim", [url]), m=3)
            sample = await score_pair(paired(), judge, "combine")
    finally:
        await server.close()
    assert sample.judge_calls == 4 and sample.hint is not None
    assert sim.stats.max_in_flight == 4  # 3 eval votes and the hint vote at once


IDENTITY = JudgeIdentity(backend="sglang", prompt_version="v1")
TEACHER = TeacherOutput([-1.0, -2.0], None)


@pytest.mark.parametrize(
    ("eval_score", "hint", "first_judged", "expected"),
    [
        (1.0, "Quote the exact figure.", False, (1, None, 1.0, True)),  # combined sample
        (-1.0, None, False, (1, None, -1.0, False)),  # RL-only
        (0.0, "Quote the exact figure.", False, (1, None, 0.0, True)),  # OPD-only, reward 0
        (0.0, "Quote the exact figure.", True, (1, None, 0.0, True)),
        (0.0, None, False, (0, "neutral_score", 0.0, False)),  # neither: nothing to learn
        (0.0, None, True, (0, "neutral_score", 0.0, False)),  # no at-least-one in combine
    ],
)
def test_combine_keeps_a_turn_with_either_signal(
    eval_score: float, hint: str | None, first_judged: bool, expected: tuple
) -> None:
    pair = paired([5, 6]).model_copy(update={"first_judged": first_judged})
    ev = EvalResult(eval_score, [int(eval_score)] * 3, 3, 0.0)
    hi = HintResult(hint, [1 if hint else -1], 1, 0.0)
    teacher = TEACHER if hint else None
    sample = build_sample(pair, IDENTITY, "combine", ev, hi, 0.1, teacher)
    got = (
        sample.loss_mask,
        sample.exclude_reason,
        sample.score,
        sample.teacher_logprobs is not None,
    )
    assert got == expected


def test_opd_needs_sglang_and_a_policy_tokenizer() -> None:
    from pydantic import ValidationError

    from pipeline.settings import ScoringSettings

    with pytest.raises(ValidationError, match="use judge sglang"):
        ScoringSettings(judge="openai", judge_urls=["http://127.0.0.1:9"], mode="opd")
    with pytest.raises(ValidationError, match="TURNSTREAM_SCORING_POLICY_TOKENIZER"):
        ScoringSettings(judge="sglang", judge_urls=["http://127.0.0.1:9"], mode="combine")


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
    assert sample.teacher_top_logprobs is not None and len(sample.teacher_top_logprobs) == 4
    assert all(len(position) == 3 for position in sample.teacher_top_logprobs)
    assert all(
        lp < 0 and isinstance(tid, int) for p in sample.teacher_top_logprobs for lp, tid in p
    )
    # ... survive the topic: JSON carries each (log-prob, id) as a two-item array
    decoded = decode_as(Sample, orjson.dumps(sample.model_dump(mode="json")))
    assert decoded.teacher_top_logprobs == sample.teacher_top_logprobs
    # ... and reach the trainer's batch at the response positions
    t = tokenize_sample(sample, PolicyTokenizer(tiny_tokenizer).tok, max_seq_len=4096)
    assert not t.teacher_misaligned and t.teacher_topk == sample.teacher_top_logprobs
    mb = collate([t], pad_id=0)
    assert mb.teacher_topk_ids is not None and mb.has_teacher_topk is not None
    positions = mb.response_mask[0].nonzero().flatten()
    ids = [[tid for _lp, tid in p] for p in sample.teacher_top_logprobs]
    assert mb.teacher_topk_ids[0, positions].tolist() == ids and mb.has_teacher_topk.all()


def test_sglang_prompts_use_the_judge_tokenizer_chat_template(tiny_tokenizer: Path) -> None:
    from pipeline.judge.factory import build_judge
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
