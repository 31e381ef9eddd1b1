"""Constrained decoding on the real SmolLM2-135M-Instruct: a judge's score regex, a JSON
schema, and constrained rows batched with free ones."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.serving.server import ServerState
from tests.servers import embedded_server, post

SCORE = r"[^\\\n]{0,200}\\boxed\{(-1|0|1)\}"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "integer"}},
    "required": ["answer", "confidence"],
}
JUDGE = (
    "A user asked an assistant: 'What is the capital of France?'\n"
    "The assistant answered: 'The capital of France is Paris.'\n"
    "Was the answer correct? Say why in one short sentence, then give your score: "
    "\\boxed{1} if correct, \\boxed{-1} if wrong, \\boxed{0} if you cannot tell."
)
QUESTION = "What is the capital of France? Reply in JSON with an answer and a confidence."


@pytest.fixture(scope="module")
def served(smollm2: Path) -> Iterator[tuple[str, ServerState]]:
    with embedded_server(smollm2, context_length=1024, max_running_requests=32) as running:
        yield running


def chat_ids(state: ServerState, content: str) -> list[int]:
    return state.render([{"role": "user", "content": content}], None, {})


def generate(url: str, body: dict) -> list[dict]:
    status, data = post(url + "/generate", body, timeout=300)
    assert status == 200, data
    return data if isinstance(data, list) else [data]


def test_a_hundred_sampled_votes_all_end_in_a_score_box(served: tuple[str, ServerState]) -> None:
    """The regex bounds a vote's reason in characters, not tokens: at temperature 1 most
    votes take 45-65 tokens, but gibberish (few characters a token) can take 110. So the
    limit leaves room for every vote to reach its box, and most must be within 80."""
    url, state = served
    eos = state.tokenizer.eos_token_id
    params = {"temperature": 1.0, "max_new_tokens": 160, "n": 20, "regex": SCORE}
    votes = []
    for _ in range(5):
        votes += generate(url, {"input_ids": chat_ids(state, JUDGE), "sampling_params": params})
    assert len(votes) == 100
    for vote in votes:
        assert re.fullmatch(SCORE, vote["text"]), vote["text"]
        assert vote["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}, vote
    lengths = sorted(len(v["output_ids"]) for v in votes)
    assert sum(n <= 80 for n in lengths) >= 90, lengths
    assert len({v["text"] for v in votes}) > 10  # sampled, not one answer a hundred times


def test_a_json_schema_is_honoured(served: tuple[str, ServerState]) -> None:
    url, state = served
    schema = json.dumps(SCHEMA)
    params = [
        {"temperature": 0.7, "max_new_tokens": 80, "sampling_seed": s, "json_schema": schema}
        for s in range(4)
    ]
    answers = generate(
        url, {"input_ids": [chat_ids(state, QUESTION)] * 4, "sampling_params": params}
    )
    for answer in answers:
        assert answer["meta_info"]["finish_reason"]["type"] == "stop", answer
        data = json.loads(answer["text"])
        assert isinstance(data["answer"], str) and isinstance(data["confidence"], int), data


def test_constrained_and_free_rows_batched_answer_as_alone(
    served: tuple[str, ServerState],
) -> None:
    url, state = served
    prompts = [chat_ids(state, JUDGE), chat_ids(state, QUESTION), chat_ids(state, QUESTION)]
    params = [
        {"temperature": 0, "max_new_tokens": 80, "regex": SCORE},
        {"temperature": 0, "max_new_tokens": 40},
        {"temperature": 0, "max_new_tokens": 40, "json_schema": json.dumps(SCHEMA)},
    ]
    alone = [
        generate(url, {"input_ids": p, "sampling_params": s})[0]
        for p, s in zip(prompts, params, strict=True)
    ]
    steps = state.engine.steps
    together = generate(url, {"input_ids": prompts, "sampling_params": params})
    assert state.engine.steps - steps <= max(len(a["output_ids"]) for a in alone) + 1
    for a, b in zip(alone, together, strict=True):
        assert a["output_ids"] == b["output_ids"], (a["text"], b["text"])
    assert re.fullmatch(SCORE, together[0]["text"])
    assert together[1]["text"] != together[2]["text"]  # the schema changed the answer
