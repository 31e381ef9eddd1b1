"""Samples into token ids and tensors: the response as the chat template renders it,
end-of-turn token included, with rollout and teacher values aligned position by position."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.events import JudgeIdentity, Response, Sample
from pipeline.training.batch import (
    TokenizedSample,
    alike,
    collate,
    micro_batches,
    padding_fraction,
    step_baseline,
    step_totals,
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
    assert mb.rollout_logprobs[0, 2:].tolist() == pytest.approx([-0.1, -0.2])
    assert mb.rollout_logprobs[0, :2].isnan().all() and mb.rollout_logprobs[1].isnan().all()
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert (mb.tokens, mb.samples) == (3, 2)
    assert mb.teacher_topk_ids is None and not mb.has_teacher.any()


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


def load(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def test_samples_without_ids_use_the_policy_chat_template(tiny_tokenizer: Path) -> None:
    tok = load(tiny_tokenizer)
    t = tokenize_sample(sample(), tok, max_seq_len=4096)
    messages = [{"role": "user", "content": "run the tests"}]
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert t.prompt_ids == tok.encode(prompt, add_special_tokens=False)
    # The response as ChatML renders it after the prompt, up to its end-of-turn token.
    assert tok.decode(t.response_ids) == "All 42 tests passed.<|im_end|>"
    assert t.response_ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    full = tok.apply_chat_template(
        [*messages, {"role": "assistant", "content": "All 42 tests passed."}], tokenize=False
    )
    assert full == tok.decode(t.prompt_ids + t.response_ids) + "\n"  # ChatML's newline after it
    assert t.rollout_logprobs is None


def test_rollout_logprobs_without_an_end_of_turn_entry_get_nan_there(tiny_tokenizer: Path) -> None:
    tok = load(tiny_tokenizer)
    n = len(tokenize_sample(sample(), tok, 4096).response_ids)
    reported = [-0.1 * (i + 1) for i in range(n - 1)]  # the engine reported none for <|im_end|>
    t = tokenize_sample(sample(response_logprobs=reported), tok, 4096)
    assert t.rollout_logprobs is not None and len(t.rollout_logprobs) == n
    assert t.rollout_logprobs[:-1] == pytest.approx(reported) and math.isnan(t.rollout_logprobs[-1])
    mb = collate([t], pad_id=0)
    positions = mb.response_mask[0].nonzero().flatten().tolist()
    assert mb.rollout_logprobs[0, positions[:-1]].tolist() == pytest.approx(reported)
    assert mb.rollout_logprobs[0, positions[-1]].isnan()  # no correction there, never 0
    full = tokenize_sample(sample(response_logprobs=[*reported, -0.05]), tok, 4096)
    assert full.rollout_logprobs == pytest.approx([*reported, -0.05])
    for wrong in (reported[:-1], [*reported, -0.05, -0.05]):  # do not describe these tokens
        assert tokenize_sample(sample(response_logprobs=wrong), tok, 4096).rollout_logprobs is None


def test_own_ids_get_the_end_of_turn_token_their_logprobs_lack(tiny_tokenizer: Path) -> None:
    tok = load(tiny_tokenizer)
    eot = tok.eos_token_id
    s = sample(prompt_ids=[1, 2, 3], response_ids=[50, 51], response_logprobs=[-1.0, -2.0])
    t = tokenize_sample(s, tok, 4096)
    assert t.response_ids == [50, 51, eot] and t.prompt_ids == [1, 2, 3]
    assert t.rollout_logprobs is not None and t.rollout_logprobs[:2] == [-1.0, -2.0]
    assert math.isnan(t.rollout_logprobs[2])
    done = sample(response_ids=[50, 51, eot], response_logprobs=[-1.0, -2.0, -0.1])
    assert tokenize_sample(done, tok, 4096).rollout_logprobs == [-1.0, -2.0, -0.1]


def test_a_response_cut_at_its_length_limit_trains_without_an_end_of_turn_token(
    tiny_tokenizer: Path,
) -> None:
    """The policy never generated the end-of-turn token of a truncated answer: training one
    there would teach it to stop exactly where the limit cut it."""
    tok = load(tiny_tokenizer)
    eot = tok.eos_token_id
    cut = Response(content="All 42 tests", finish_reason="length")
    t = tokenize_sample(sample(response=cut), tok, 4096)
    assert tok.decode(t.response_ids) == "All 42 tests" and eot not in t.response_ids
    own = sample(response=cut, prompt_ids=[1, 2, 3], response_ids=[50, 51],
                 response_logprobs=[-1.0, -2.0])  # fmt: skip
    t = tokenize_sample(own, tok, 4096)
    assert t.response_ids == [50, 51] and t.rollout_logprobs == [-1.0, -2.0]
    stopped = Response(content="All 42 tests passed.", finish_reason="stop")
    assert tokenize_sample(sample(response=stopped), tok, 4096).response_ids[-1] == eot


def test_an_explicit_end_of_turn_template_with_reasoning(header_tokenizer: Path) -> None:
    tok = load(header_tokenizer)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    response = Response(content="All 42 tests passed.", reasoning_content="Ran pytest first.")
    t = tokenize_sample(sample(response=response), tok, 4096)
    assert t.response_ids[-1] == eot == tok.eos_token_id
    assert t.response_ids.count(eot) == 1
    assert (
        tok.decode(t.response_ids)
        == "<think>Ran pytest first.</think>\nAll 42 tests passed.<|eot_id|>"
    )
    messages = [{"role": "user", "content": "run the tests"}]
    reply = {
        "role": "assistant",
        "content": "All 42 tests passed.",
        "reasoning_content": "Ran pytest first.",
    }
    full = tok.apply_chat_template([*messages, reply], tokenize=False)
    assert tok.decode(t.prompt_ids + t.response_ids) == full
    n = len(t.response_ids)
    aligned = tokenize_sample(
        sample(response=response, response_logprobs=[-0.5] * (n - 1)), tok, 4096
    )
    assert aligned.rollout_logprobs is not None and len(aligned.rollout_logprobs) == n
    assert math.isnan(aligned.rollout_logprobs[-1])


def test_a_turn_that_only_calls_a_tool_still_has_response_tokens(tiny_tokenizer: Path) -> None:
    tok = load(tiny_tokenizer)
    args = '{"path": "tests"}'  # a JSON string, as OpenAI sends it
    call = {"id": "c1", "type": "function", "function": {"name": "pytest", "arguments": args}}
    t = tokenize_sample(
        sample(response={"content": None, "tool_calls": [call]}), tok, max_seq_len=4096
    )
    text = tok.decode(t.response_ids).strip()
    assert text.startswith("<tool_call>pytest(") and text.endswith("</tool_call><|im_end|>")
    assert "path" in text and "tests" in text and t.response_ids[-1] == tok.eos_token_id


def test_teacher_logprobs_that_do_not_cover_the_response_are_dropped() -> None:
    s = sample(
        prompt_ids=list(range(10)),
        response_ids=[50, 51, 52],
        response_logprobs=[-1.0, -2.0, -3.0],
        teacher_logprobs=[-0.5, -0.5],
    )
    t = tokenize_sample(s, tokenizer=None, max_seq_len=8)
    assert t.response_ids == [50, 51, 52] and t.prompt_ids == [5, 6, 7, 8, 9]
    assert t.rollout_logprobs == [-1.0, -2.0, -3.0]
    assert t.teacher_logprobs is None and t.teacher_misaligned  # never zero-padded
    mb = collate([t], pad_id=0)
    assert torch.equal(mb.has_teacher, torch.tensor([False]))
    assert not mb.teacher_logprobs.any()
    covered = tokenize_sample(s.model_copy(update={"teacher_logprobs": [-0.5] * 3}), None, 8)
    assert covered.teacher_logprobs == [-0.5] * 3 and not covered.teacher_misaligned


def test_the_teachers_top_k_ids_reach_the_batch() -> None:
    top = [[(-0.5, 7), (-1.5, 9)], [(-0.2, 3), (-2.0, 4)], [(-0.1, 1), (-3.0, 2)]]
    s = sample(
        prompt_ids=[1, 2, 3],
        response_ids=[50, 51, 52],
        teacher_logprobs=[-0.6, -0.3, -0.2],
        teacher_top_logprobs=top,
    )
    t = tokenize_sample(s, tokenizer=None, max_seq_len=64)
    other = TokenizedSample("b", [1], [60], 0.0, None, None, 0)
    mb = collate([t, other], pad_id=0)
    assert mb.teacher_topk_ids is not None and mb.teacher_topk_logprobs is not None
    assert mb.has_teacher_topk is not None and mb.has_teacher_topk.tolist() == [True, False]
    # response log-prob positions 2, 3, 4 hold the teacher's K ids and log-probs
    assert mb.teacher_topk_ids[0, 2:5].tolist() == [[7, 9], [3, 4], [1, 2]]
    expected = torch.tensor([[-0.5, -1.5], [-0.2, -2.0], [-0.1, -3.0]])
    assert torch.allclose(mb.teacher_topk_logprobs[0, 2:5], expected)
    assert not mb.teacher_topk_ids[0, :2].any() and not mb.teacher_topk_ids[1].any()
    short = s.model_copy(update={"teacher_top_logprobs": top[:2]})
    assert tokenize_sample(short, None, 64).teacher_misaligned


def test_a_contrastive_teacher_trains_on_hinted_minus_neutral_whatever_old_is() -> None:
    s = sample(
        prompt_ids=[1, 2, 3],
        response_ids=[50, 51],
        teacher_logprobs=[-0.5, -2.0],
        teacher_neutral_logprobs=[-1.25, -1.5],  # the hint lifts token 1, lowers token 2
    )
    t = tokenize_sample(s, tokenizer=None, max_seq_len=64)
    assert t.teacher_logprobs == [0.75, -0.5] and t.teacher_is_gap
    plain = tokenize_sample(s.model_copy(update={"teacher_neutral_logprobs": None}), None, 64)
    assert plain.teacher_logprobs == [-0.5, -2.0] and not plain.teacher_is_gap
    short = s.model_copy(update={"teacher_neutral_logprobs": [-1.0]})
    cut = tokenize_sample(short, None, 64)
    assert cut.teacher_logprobs is None and cut.teacher_misaligned  # no signal, never padded
    mb = collate([t, plain], pad_id=0)
    assert mb.teacher_is_gap is not None and mb.teacher_is_gap.tolist() == [True, False]
    old = torch.tensor([[0.0, 0.0, -3.0, -4.0], [0.0, 0.0, -0.5, -1.0]])
    taught = mb.teacher_for(old)
    # row 0: teacher - old is hinted - neutral at the response positions (2, 3), not -0.5 - old
    assert (taught - old)[0, 2:].tolist() == [0.75, -0.5]
    assert (taught - old)[1, 2:].tolist() == [0.0, -1.0]  # row 1: hinted - old, as before
    assert torch.equal(
        collate([plain], pad_id=0).teacher_for(old[1:]), collate([plain], 0).teacher_logprobs
    )


def test_top_k_ids_outside_the_policy_vocabulary_are_no_signal(tiny_tokenizer: Path) -> None:
    tok = load(tiny_tokenizer)
    s = sample(prompt_ids=[1, 2], response_ids=[5, tok.eos_token_id], teacher_logprobs=[-1.0, -1.0])
    inside = s.model_copy(update={"teacher_top_logprobs": [[(-1.0, 3)], [(-1.0, 4)]]})
    outside = s.model_copy(update={"teacher_top_logprobs": [[(-1.0, 3)], [(-1.0, len(tok))]]})
    assert not tokenize_sample(inside, tok, 64).teacher_misaligned
    assert tokenize_sample(outside, tok, 64).teacher_misaligned


def test_step_totals_count_tokens_and_samples_with_tokens() -> None:
    pad = TokenizedSample("__pad__", [1], [], 0.0, None, None, None)
    assert step_totals([ts("a", 3, 2), ts("b", 1, 4), pad]) == (6, 2)


def test_a_step_baseline_takes_each_reward_relative_to_the_rest_of_its_step() -> None:
    import dataclasses

    pad = TokenizedSample("__pad__", [1], [], 0.0, None, None, None)
    step = [dataclasses.replace(ts(f"s{i}", 2, 2), reward=r) for i, r in enumerate([1, -1, -1, -1])]
    assert step_baseline([*step, pad], "none") == [*step, pad]
    mean = step_baseline([*step, pad], "mean")
    assert [s.reward for s in mean] == [1.5, -0.5, -0.5, -0.5, 0.0]  # the pad takes no part
    assert [s.sample_id for s in mean] == ["s0", "s1", "s2", "s3", "__pad__"]
    loo = step_baseline(step, "leave_one_out")
    assert [s.reward for s in loo] == pytest.approx([2.0, -2 / 3, -2 / 3, -2 / 3])
    failed = [dataclasses.replace(s, reward=-1.0) for s in step]
    assert [s.reward for s in step_baseline(failed, "mean")] == [0.0] * 4  # nothing to learn
    raw = step_baseline([*failed, pad], "mean", alike="raw")  # every answer rejected
    assert [s.reward for s in raw] == [-1.0, -1.0, -1.0, -1.0, 0.0]
    assert [s.reward for s in step_baseline(step, "mean", alike="raw")] == [1.5, -0.5, -0.5, -0.5]
    assert [s.reward for s in step] == [1, -1, -1, -1]  # the step's own samples are unchanged
    assert alike([*failed, pad]) and not alike([*step, pad])  # the pad has no score to count
    assert alike([pad]) and alike([])


def test_a_prompt_grouped_baseline_takes_each_reward_relative_to_the_same_prompts_answers() -> None:
    """by prompt: answers to one prompt against each other (GRPO's group inside the step);
    a prompt the step holds once against the whole step, as by step."""

    def answer(i: int, prompt: list[int], r: float) -> TokenizedSample:
        return dataclasses.replace(ts(f"s{i}", 2, 2), prompt_ids=prompt, reward=r)

    easy, hard, once = [1, 2], [3, 4], [5, 6]
    step = [
        answer(0, easy, 1.0),
        answer(1, easy, 1.0),
        answer(2, easy, -1.0),
        answer(3, hard, -1.0),
        answer(4, hard, -1.0),
        answer(5, once, 1.0),
    ]
    pad = TokenizedSample("__pad__", easy, [], 0.0, None, None, None)
    grouped = step_baseline([*step, pad], "mean", by="prompt")
    assert [s.reward for s in grouped] == pytest.approx([2 / 3, 2 / 3, -4 / 3, 0.0, 0.0, 1.0, 0.0])
    by_step = step_baseline(step, "mean")  # the whole step's mean, 0
    assert [s.reward for s in by_step] == [1.0, 1.0, -1.0, -1.0, -1.0, 1.0]
    loo = step_baseline(step[:3], "leave_one_out", by="prompt")
    assert [s.reward for s in loo] == pytest.approx([1.0, 1.0, -2.0])
    failed = [dataclasses.replace(s, reward=-1.0) for s in step]
    raw = step_baseline(failed, "mean", alike="raw", by="prompt")  # every answer rejected
    assert [s.reward for s in raw] == [-1.0] * 6
