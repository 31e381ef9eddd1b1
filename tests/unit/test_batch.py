from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from pipeline.events import JudgeIdentity, Response, Sample
from pipeline.training.batch import (
    TokenizedSample,
    collate,
    micro_batches,
    padding_fraction,
    tokenize_sample,
)


def ts(sid: str, prompt: int, response: int, rollout: bool = True) -> TokenizedSample:
    return TokenizedSample(
        sid,
        list(range(1, prompt + 1)),
        list(range(100, 100 + response)),
        1.0,
        [-0.1 * (i + 1) for i in range(response)] if rollout else None,
        None,
        0,
    )


def test_response_log_probs_are_aligned_to_next_token_positions() -> None:
    mb = collate([ts("a", 3, 2), ts("b", 1, 1, rollout=False)], pad_id=0)
    assert mb.input_ids.tolist() == [[1, 2, 3, 100, 101], [1, 100, 0, 0, 0]]
    # a: response tokens at ids positions 3,4 -> log-prob positions 2,3
    assert mb.response_mask.tolist() == [[0, 0, 1, 1], [1, 0, 0, 0]]
    assert mb.rollout_logprobs[0].tolist() == pytest.approx([0.0, 0.0, -0.1, -0.2])
    assert mb.has_rollout.tolist() == [True, False]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert mb.tokens == 3


def test_bucketing_cuts_padding() -> None:
    rng = random.Random(0)
    samples = [ts(str(i), rng.randint(5, 400), rng.randint(1, 50)) for i in range(64)]
    plain = padding_fraction(micro_batches(samples, 4, 0, bucketing=False))
    bucketed = padding_fraction(micro_batches(samples, 4, 0, bucketing=True))
    assert bucketed < plain / 2
    assert sum(len(mb.sample_ids) for mb in micro_batches(samples, 4, 0)) == 64


def sample(**kw) -> Sample:  # type: ignore[no-untyped-def]
    base = dict(
        sample_id="s:0",
        session_id="s",
        turn_index=0,
        messages=[{"role": "user", "content": "run the tests"}],
        response=Response(content="All 42 tests passed."),
        next_state=None,
        score=1.0,
        votes=[1],
        judge_calls=1,
        exclude_reason=None,
        loss_mask=1,
        mode="rl",
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
    )
    base.update(kw)
    return Sample.model_validate(base)


def test_samples_without_ids_use_the_policy_chat_template(tiny_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer), local_files_only=True)
    t = tokenize_sample(sample(), tok, max_seq_len=4096)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "run the tests"}], tokenize=False, add_generation_prompt=True
    )
    assert t.prompt_ids == tok.encode(prompt, add_special_tokens=False)
    # A text response is its content (rollout and teacher log-probs cover those tokens).
    assert tok.decode(t.response_ids) == "All 42 tests passed."
    assert t.rollout_logprobs is None


def test_a_turn_that_only_calls_a_tool_still_has_response_tokens(tiny_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer), local_files_only=True)
    args = '{"path": "tests"}'  # a JSON string, as OpenAI sends it
    call = {"id": "c1", "type": "function", "function": {"name": "pytest", "arguments": args}}
    t = tokenize_sample(
        sample(response={"content": None, "tool_calls": [call]}), tok, max_seq_len=4096
    )
    text = tok.decode(t.response_ids).strip()
    assert text.startswith("<tool_call>pytest(") and text.endswith("</tool_call><|im_end|>")
    assert "path" in text and "tests" in text


def test_own_ids_win_and_logprobs_are_fitted_and_prompt_truncated_left() -> None:
    s = sample(
        prompt_ids=list(range(10)),
        response_ids=[50, 51, 52],
        response_logprobs=[-1.0, -2.0, -3.0],
        teacher_logprobs=[-0.5, -0.5],
    )
    t = tokenize_sample(s, tokenizer=None, max_seq_len=8)
    assert t.response_ids == [50, 51, 52] and t.prompt_ids == [5, 6, 7, 8, 9]
    assert t.rollout_logprobs == [-1.0, -2.0, -3.0]
    assert t.teacher_logprobs == [-0.5, -0.5, 0.0]  # zero-padded to the response length
    mb = collate([t], pad_id=0)
    assert torch.equal(mb.has_teacher, torch.tensor([True]))
