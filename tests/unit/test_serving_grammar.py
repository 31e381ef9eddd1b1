"""Constrained decoding (regex, json_schema, ebnf) and shared prefills in the embedded server,
on a tiny random policy whose lm_head is wider than its tokenizer (padded ids)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import pytest
import torch

from pipeline.serving.engine import distinct_prompts
from pipeline.serving.grammar import Grammars, constrain, error_reason
from pipeline.serving.sampling import BadRequest, parse_sampling
from pipeline.serving.server import ServerState
from tests.servers import embedded_server, make_tiny_policy, post

PAD = 24  # lm_head rows past the tokenizer's vocabulary, as models pad them
PROMPT = [5, 17, 33, 9, 40]
YES_NO = r"(yes|no), [a-z]{1,8}\."
BOXED = r"[^\\\n]{0,24}\\boxed\{(-1|0|1)\}"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
EBNF = 'root ::= ("cat" | "dog") " " [0-9] [0-9]? "."'
EBNF_AS_REGEX = r"(cat|dog) [0-9][0-9]?\."


def make_padded_policy(out: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer random Llama whose vocabulary is the tokenizer's plus PAD unused ids."""
    return make_tiny_policy(out, tokenizer_dir, seed=11, unused_ids=PAD)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path
) -> Iterator[tuple[str, ServerState]]:
    policy = make_padded_policy(tmp_path_factory.mktemp("grammar") / "v000000", tiny_tokenizer)
    with embedded_server(policy, context_length=256, max_running_requests=16) as running:
        yield running


def generate(url: str, body: dict) -> list[dict]:
    status, data = post(url + "/generate", {"return_logprob": True, **body})
    assert status == 200, data
    return data if isinstance(data, list) else [data]


def sampled(n: int, seed: int | None = None, **grammar: str) -> dict:
    # room for BOXED's longest match: 24 characters of 4 byte tokens, the box and a stop
    params: dict = {"temperature": 1.0, "max_new_tokens": 160, "n": n, **grammar}
    if seed is not None:
        params["sampling_seed"] = seed
    return {"input_ids": PROMPT, "sampling_params": params}


def greedy(**grammar: str) -> dict:
    return {"temperature": 0, "max_new_tokens": 40, **grammar}


def assert_ends_in_stop(answer: dict, eos: int) -> None:
    meta = answer["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": eos}, answer
    assert answer["output_ids"][-1] == eos


# -- pure parts ---------------------------------------------------------------


def test_grammar_params_are_strings_and_one_at_most() -> None:
    assert parse_sampling({"regex": "a+"}).grammar == ("regex", "a+")
    assert parse_sampling({"json_schema": "{}"}).grammar == ("json", "{}")
    assert parse_sampling({"ebnf": 'root ::= "a"'}).grammar == ("ebnf", 'root ::= "a"')
    assert parse_sampling({"regex": None}).grammar is None
    with pytest.raises(BadRequest, match=r"Only one of regex, json_schema, or ebnf can be set\."):
        parse_sampling({"regex": "a", "ebnf": 'root ::= "a"'})
    with pytest.raises(BadRequest, match=r"json_schema must be a string .*json\.dumps") as err:
        parse_sampling({"json_schema": SCHEMA})
    assert err.value.param == "json_schema"


def test_distinct_prompts_index_each_copy() -> None:
    prompts = [[1, 2], [3], [1, 2], [1, 2], [3, 4]]
    assert distinct_prompts(prompts) == ([[1, 2], [3], [3, 4]], [0, 1, 0, 0, 2])


def test_xgrammar_errors_lose_their_source_location() -> None:
    raw = RuntimeError(
        "[17:15:01] /project/cpp/json_schema_converter.cc:5077: Check failed: (error.empty()) "
        "is false: Failed to parse JSON: syntax error\n"
    )
    assert error_reason(raw) == "Failed to parse JSON: syntax error"


def test_the_mask_covers_padded_ids_and_leaves_free_rows_alone(tiny_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_tokenizer))
    vocab = len(tokenizer) + PAD
    grammars = Grammars(tokenizer, vocab, [tokenizer.eos_token_id])
    matcher = grammars.matcher(grammars.compile("regex", "(yes|no)"))
    logits = torch.randn(3, vocab)
    logits[:, len(tokenizer) :] = 100.0  # the padded ids would win every row
    before = logits.clone()
    constrain(logits, [None, matcher, None])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert allowed and all(i < len(tokenizer) for i in allowed)
    assert {tokenizer.decode([i]) for i in allowed} <= {"y", "ye", "yes", "n", "no"}
    with pytest.raises(BadRequest, match="Failed to compile regex grammar") as err:
        grammars.compile("regex", "(unclosed")
    assert err.value.param == "regex"


# -- served -------------------------------------------------------------------


def test_every_sample_matches_its_regex_and_ends_on_a_stop(
    server: tuple[str, ServerState],
) -> None:
    url, state = server
    eos = state.tokenizer.eos_token_id
    vocab = len(state.tokenizer)
    for pattern in (YES_NO, BOXED):
        answers = generate(url, sampled(8, regex=pattern))
        answers += generate(url, {"input_ids": PROMPT, "sampling_params": greedy(regex=pattern)})
        for answer in answers:
            assert re.fullmatch(pattern, answer["text"]), answer["text"]
            assert_ends_in_stop(answer, eos)
            assert all(i < vocab for i in answer["output_ids"])
            logprobs = [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
            assert all(-1e9 < lp <= 0 for lp in logprobs)
        assert len({a["text"] for a in answers}) > 1
    free = generate(url, {"input_ids": PROMPT, "sampling_params": greedy()})[0]
    assert not re.fullmatch(YES_NO, free["text"])  # the grammar is what made them match


def test_a_json_schema_and_an_ebnf_grammar_are_honoured(server: tuple[str, ServerState]) -> None:
    url, state = server
    eos = state.tokenizer.eos_token_id
    seeded = [
        sampled(1, seed, json_schema=json.dumps(SCHEMA))["sampling_params"] for seed in range(6)
    ]
    for answer in generate(url, {"input_ids": [PROMPT] * 6, "sampling_params": seeded}):
        jsonschema.validate(json.loads(answer["text"]), SCHEMA)
        assert_ends_in_stop(answer, eos)
    for answer in generate(url, sampled(6, ebnf=EBNF)):
        assert re.fullmatch(EBNF_AS_REGEX, answer["text"]), answer["text"]
        assert_ends_in_stop(answer, eos)


def test_a_grammar_ends_on_length_unfinished_and_on_stop_despite_min_new_tokens(
    server: tuple[str, ServerState],
) -> None:
    url, _state = server
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "regex": "[a-z]{50}"}}
    [answer] = generate(url, body)
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert re.fullmatch("[a-z]+", answer["text"])
    # min_new_tokens bans the stop token, but the finished grammar allows nothing else
    body = {"input_ids": PROMPT, "sampling_params": {"min_new_tokens": 8, "regex": "(yes|no)"}}
    [answer] = generate(url, body)
    assert answer["meta_info"]["finish_reason"]["type"] == "stop"
    assert answer["text"] in ("yes", "no")


def test_constrained_and_free_rows_share_a_batch_and_answer_as_alone(
    server: tuple[str, ServerState],
) -> None:
    url, state = server
    prompts = [[5, 17, 33, 2 + i, 40] for i in range(4)]
    params = [greedy(), greedy(regex=YES_NO), greedy(), greedy(ebnf=EBNF)]
    alone = [
        generate(url, {"input_ids": p, "sampling_params": s})[0]
        for p, s in zip(prompts, params, strict=True)
    ]
    steps = state.engine.steps
    together = generate(url, {"input_ids": prompts, "sampling_params": params})
    longest = max(len(a["output_ids"]) for a in alone)
    assert state.engine.steps - steps <= longest + 1  # one batch, not one request after another
    for a, b in zip(alone, together, strict=True):
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        lp_a = [e[0] for e in a["meta_info"]["output_token_logprobs"]]
        lp_b = [e[0] for e in b["meta_info"]["output_token_logprobs"]]
        assert lp_a == pytest.approx(lp_b, abs=1e-4)
    assert re.fullmatch(YES_NO, together[1]["text"])
    assert re.fullmatch(EBNF_AS_REGEX, together[3]["text"])
    assert not re.fullmatch(YES_NO, together[0]["text"])


def test_a_grammar_that_allows_nothing_aborts_only_its_own_request(
    server: tuple[str, ServerState],
) -> None:
    url, _state = server
    params = [greedy(regex=r"[^\x00-\U0010FFFF]"), greedy()]  # no character at all
    [dead, free] = generate(url, {"input_ids": [PROMPT, PROMPT[::-1]], "sampling_params": params})
    assert dead["meta_info"]["finish_reason"]["type"] == "abort" and dead["output_ids"] == []
    assert free["meta_info"]["finish_reason"] == {"type": "length", "length": 40}


def test_the_chat_endpoint_takes_regex_ebnf_and_response_format(
    server: tuple[str, ServerState],
) -> None:
    url, _state = server
    # sampled: greedy, a random policy loops on the whitespace JSON allows (as SGLang's does)
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "seed": 5}
    schema_format = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    formats: list[tuple[dict, Callable[[str], object]]] = [
        ({"regex": YES_NO}, lambda t: re.fullmatch(YES_NO, t)),
        ({"ebnf": EBNF}, lambda t: re.fullmatch(EBNF_AS_REGEX, t)),
        (
            {"response_format": schema_format},
            lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None,
        ),
        ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
    ]
    for extra, holds in formats:
        status, answer = post(url + "/v1/chat/completions", {**base, **extra})
        assert status == 200, answer
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "stop" and holds(choice["message"]["content"]), choice


BAD = [
    ("/generate", {"regex": "(unclosed"}, "Failed to compile regex grammar", "regex"),
    ("/generate", {"json_schema": "{not json"}, "Failed to compile json grammar", "json_schema"),
    ("/generate", {"ebnf": "root ::= nothing"}, "Failed to compile ebnf grammar", "ebnf"),
    ("/generate", {"json_schema": SCHEMA}, "must be a string", "json_schema"),
    ("/generate", {"regex": "a", "json_schema": "{}"}, "Only one of regex, json_schema", None),
    ("/v1/chat/completions", {"regex": "(unclosed"}, "Failed to compile regex grammar", "regex"),
    (
        "/v1/chat/completions",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
        "response_format",
    ),
    (
        "/v1/chat/completions",
        {"response_format": {"type": "structural_tag"}},
        "text, json_object or json_schema",
        "response_format",
    ),
    ("/v1/chat/completions", {"regex": "a", "ebnf": 'root ::= "a"'}, "Only one of", None),
]


@pytest.mark.parametrize(("path", "grammar", "says", "param"), BAD)
def test_a_bad_grammar_is_a_400_naming_it(
    server: tuple[str, ServerState], path: str, grammar: dict, says: str, param: str | None
) -> None:
    url, state = server
    if path == "/generate":
        body: dict = {"input_ids": PROMPT, "sampling_params": grammar}
    else:
        body = {"messages": [{"role": "user", "content": "hi"}], **grammar}
    queued = state.engine.load()["prefill_tokens"]
    status, answer = post(url + path, body)
    assert status == 400, answer
    if path == "/generate":
        assert says in answer["error"]["message"]
    else:
        assert answer["object"] == "error" and says in answer["message"]
        assert param is None or answer["param"] == param
    assert state.engine.load()["prefill_tokens"] == queued  # nothing of it ran


# -- shared prefill -------------------------------------------------------------


def test_copies_of_a_prompt_are_prefilled_once(server: tuple[str, ServerState]) -> None:
    url, state = server
    prompt = [7, 19, 23, 29, 31, 37]
    plain = {"temperature": 0, "max_new_tokens": 12}
    before = state.engine.load()["prefill_tokens"]
    [alone] = generate(url, {"input_ids": prompt, "sampling_params": plain})
    assert state.engine.load()["prefill_tokens"] - before == len(prompt)
    before = state.engine.load()["prefill_tokens"]
    three = generate(url, {"input_ids": prompt, "sampling_params": {**plain, "n": 3}})
    assert state.engine.load()["prefill_tokens"] - before == len(prompt)
    assert [a["output_ids"] for a in three] == [alone["output_ids"]] * 3
    before = state.engine.load()["prefill_tokens"]
    seeds = [{"temperature": 1.0, "max_new_tokens": 12, "sampling_seed": s} for s in (1, 2, 3)]
    sampled_three = generate(url, {"input_ids": [prompt] * 3, "sampling_params": seeds})
    assert state.engine.load()["prefill_tokens"] - before == len(prompt)
    assert len({tuple(a["output_ids"]) for a in sampled_three}) == 3
    again = generate(url, {"input_ids": prompt, "sampling_params": seeds[1]})
    assert again[0]["output_ids"] == sampled_three[1]["output_ids"]  # each copy its own sample
