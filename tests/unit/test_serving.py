"""The embedded server on a tiny random policy: SGLang's shapes, batching, pushes, 4xx."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeline.broker.local import free_port_pair
from pipeline.serving.server import ServerState
from tests.servers import embedded_server, get, make_tiny_policy, post

PROMPTS = [[5, 17, 33, 2 + i, 40] for i in range(6)]


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> tuple[Path, Path]:
    """Version 0 and a perturbed version 1 of one tiny policy, named like trainer pushes."""
    root = tmp_path_factory.mktemp("policies")
    first = make_tiny_policy(root / "v000000", tiny_tokenizer, seed=3)
    second = make_tiny_policy(root / "v000001", tiny_tokenizer, seed=3, noise=0.05)
    return first, second


@pytest.fixture
def server(policies: tuple[Path, Path]) -> Iterator[tuple[str, ServerState]]:
    with embedded_server(policies[0], context_length=256, max_running_requests=8) as running:
        yield running


def generate(url: str, prompt: list[int], **extra: object) -> dict:
    body = {"input_ids": prompt, "return_logprob": True, **extra}
    body.setdefault("sampling_params", {"temperature": 0, "max_new_tokens": 12})
    status, data = post(url + "/generate", body)
    assert status == 200, data
    return data


def teacher_forced(url: str, prompt: list[int], answer: list[int]) -> list[float]:
    """Log-probs of ``answer`` after ``prompt``, as the OPD teacher asks for them."""
    data = generate(
        url,
        prompt + answer,
        logprob_start_len=len(prompt) - 1,
        sampling_params={"max_new_tokens": 0, "temperature": 0},
    )
    entries = data["meta_info"]["input_token_logprobs"]
    assert entries[0][0] is None and [e[1] for e in entries] == (prompt + answer)[len(prompt) - 1 :]
    assert data["output_ids"] == [] and data["meta_info"]["finish_reason"]["type"] == "length"
    return [e[0] for e in entries[1:]]


def test_generate_answers_in_sglang_shapes_and_teacher_forcing_agrees(
    server: tuple[str, ServerState],
) -> None:
    url, _state = server
    data = generate(url, PROMPTS[0], top_logprobs_num=3, return_text_in_logprobs=True)
    meta = data["meta_info"]
    assert meta["completion_tokens"] == len(data["output_ids"]) == 12
    assert meta["prompt_tokens"] == 5 and meta["weight_version"] == "0"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["input_token_logprobs"] == [] and meta["input_top_logprobs"] == []
    outputs = meta["output_token_logprobs"]
    assert [e[1] for e in outputs] == data["output_ids"]
    assert all(isinstance(e[2], str) for e in outputs)
    for entry, top in zip(outputs, meta["output_top_logprobs"], strict=True):
        assert len(top) == 3 and top[0][1] == entry[1] and top[0][0] == pytest.approx(entry[0])
    forced = teacher_forced(url, PROMPTS[0], data["output_ids"])
    assert forced == pytest.approx([e[0] for e in outputs], abs=1e-4)


def test_concurrent_requests_are_batched_and_answer_as_alone(
    server: tuple[str, ServerState],
) -> None:
    url, state = server
    alone = [generate(url, p) for p in PROMPTS]
    assert state.engine.widest == 1
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: generate(url, p), PROMPTS))
    assert state.engine.widest > 1
    for a, b in zip(alone, together, strict=True):
        assert a["output_ids"] == b["output_ids"]
        lp_a = [e[0] for e in a["meta_info"]["output_token_logprobs"]]
        lp_b = [e[0] for e in b["meta_info"]["output_token_logprobs"]]
        assert lp_a == pytest.approx(lp_b, abs=1e-4)


def test_greedy_is_deterministic_and_a_seed_fixes_a_sample(server: tuple[str, ServerState]) -> None:
    url, _state = server
    batch = {
        "input_ids": [PROMPTS[1]] * 2,
        "sampling_params": {"temperature": 0, "max_new_tokens": 20},
    }
    status, pair = post(url + "/generate", batch)
    assert status == 200 and pair[0]["output_ids"] == pair[1]["output_ids"]
    seeded = {"temperature": 1.0, "max_new_tokens": 16, "sampling_seed": 7}
    first = generate(url, PROMPTS[2], sampling_params=seeded)
    again = generate(url, PROMPTS[2], sampling_params=seeded)
    assert first["output_ids"] == again["output_ids"]


def test_parallel_sampling_answers_n_samples_of_one_prompt(
    server: tuple[str, ServerState],
) -> None:
    """SGLang's ``sampling_params.n``: the judge asks its m votes in one request."""
    url, _state = server
    body = {"input_ids": PROMPTS[3], "sampling_params": {"temperature": 1.0, "max_new_tokens": 8,
            "n": 3}}  # fmt: skip
    status, answers = post(url + "/generate", body)
    assert status == 200 and isinstance(answers, list) and len(answers) == 3
    assert all(a["meta_info"]["completion_tokens"] == len(a["output_ids"]) for a in answers)
    assert len({tuple(a["output_ids"]) for a in answers}) > 1  # independent samples
    two = [PROMPTS[0], PROMPTS[0][::-1]]
    batch = {"input_ids": two, "sampling_params": {"temperature": 0, "max_new_tokens": 12, "n": 2}}
    status, four = post(url + "/generate", batch)
    assert status == 200 and len(four) == 4
    assert [a["meta_info"]["prompt_tokens"] for a in four] == [5, 5, 5, 5]
    # SGLang's order: each prompt's n answers together, [p1, p1, p2, p2] (greedy: alike)
    for i, prompt in enumerate(two):
        alone = generate(url, prompt, sampling_params={"temperature": 0, "max_new_tokens": 12})
        assert four[2 * i]["output_ids"] == four[2 * i + 1]["output_ids"] == alone["output_ids"]
    assert four[1]["output_ids"] != four[2]["output_ids"]  # the two prompts answer apart
    status, bad = post(url + "/generate", {"input_ids": PROMPTS[0], "sampling_params": {"n": 0}})
    assert status == 400, bad


def test_stop_strings_end_and_trim_the_text_alike_streamed_or_not(
    server: tuple[str, ServerState],
) -> None:
    url, state = server
    free = generate(url, PROMPTS[3], sampling_params={"temperature": 0, "max_new_tokens": 20})
    text = free["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    body = {
        "input_ids": PROMPTS[3],
        "sampling_params": {"temperature": 0, "max_new_tokens": 20, "stop": [stop]},
    }
    status, stopped = post(url + "/generate", body)
    assert status == 200 and stopped["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": stop,
    }
    assert stopped["text"] == text[: text.index(stop)]
    request = urllib.request.Request(
        url + "/generate", data=json.dumps({**body, "stream": True}).encode()
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = [line for line in response.read().decode().splitlines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    frames = [json.loads(line[5:]) for line in lines[:-1]]
    assert frames[-1]["text"] == stopped["text"] and frames[-1]["meta_info"]["finish_reason"]
    assert all(
        later["text"].startswith(earlier["text"]) for earlier, later in itertools.pairwise(frames)
    )
    assert state.engine.load()["running"] == 0


BAD = [
    ("/generate", b"{not json", 400, "not valid JSON"),
    ("/generate", {"sampling_params": {}}, 400, "Either text or input_ids"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"temprature": 0}}, 400, "temprature"),
    (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 300}},
        400,
        "maximum context length of 256",
    ),
    ("/generate", {"input_ids": [1, 99999]}, 400, "outside the vocabulary"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"top_p": 0}}, 400, "top_p"),
    (
        "/generate",
        {"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 5},
        400,
        "logprob_start_len",
    ),
    (
        "/generate",
        {"input_ids": [1, 2], "sampling_params": {"frequency_penalty": 0.5}},
        400,
        "not supported",
    ),
    (
        "/v1/chat/completions",
        {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        404,
        "does not exist",
    ),
    ("/v1/chat/completions", {"messages": []}, 400, "Messages cannot be empty"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 999},
        400,
        "maximum context length",
    ),
    ("/v1/chat/completions", [1, 2], 400, "JSON object"),
    ("/update_weights_from_disk", {"path": "x"}, 400, "model_path"),
]


@pytest.mark.parametrize(("path", "body", "status", "says"), BAD)
def test_bad_requests_get_a_4xx_json_answer(
    server: tuple[str, ServerState], path: str, body: object, status: int, says: str
) -> None:
    url, _state = server
    code, answer = post(url + path, body)
    assert code == status
    text = json.dumps(answer)
    assert says in text and "Traceback" not in text
    if path.startswith("/v1/"):
        assert answer["object"] == "error" and answer["code"] == status


def test_a_weight_push_serves_new_weights_while_requests_in_flight_finish(
    server: tuple[str, ServerState], policies: tuple[Path, Path]
) -> None:
    url, state = server
    before = generate(url, PROMPTS[4])
    long = {"temperature": 0, "max_new_tokens": 240}
    results: list[dict] = []
    threads = [
        threading.Thread(target=lambda p=p: results.append(generate(url, p, sampling_params=long)))
        for p in PROMPTS
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while state.engine.load()["running"] < len(PROMPTS) and time.monotonic() < deadline:
        time.sleep(0.001)
    status, pushed = post(url + "/update_weights_from_disk", {"model_path": str(policies[1])})
    assert status == 200 and pushed["success"] and pushed["weight_version"] == "1"
    during = generate(url, PROMPTS[4])  # served on the new weights beside the old rows
    assert state.engine.load()["running"] > 0, "the long requests ended before the push"
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == len(PROMPTS)
    assert all(r["meta_info"]["completion_tokens"] == 240 for r in results)
    assert {r["meta_info"]["weight_version"] for r in results} == {"0"}
    after = generate(url, PROMPTS[4])
    assert during["meta_info"]["weight_version"] == after["meta_info"]["weight_version"] == "1"
    old = [e[0] for e in before["meta_info"]["output_token_logprobs"]]
    new = [e[0] for e in after["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(old, new, strict=True)) > 1e-3
    info = get(url + "/get_model_info")
    assert info["weight_version"] == "1" and info["model_path"] == str(policies[1])
    refused = post(
        url + "/update_weights_from_disk", {"model_path": str(policies[1].parent / "nope")}
    )
    assert refused[0] == 400 and not refused[1]["success"]
    assert get(url + "/get_model_info")["weight_version"] == "1"


def test_turnstream_serve_serves_a_checkpoint_directory(policies: tuple[Path, Path]) -> None:
    port = free_port_pair()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "serve",
            "--model",
            str(policies[0]),
            "--port",
            str(port),
            "--context-length",
            "64",
        ],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                assert get(url + "/v1/models")["data"][0]["id"] == "v000000"
                break
            except OSError:
                assert time.monotonic() < deadline, "turnstream serve did not answer"
                time.sleep(0.3)
        assert get(url + "/get_model_info")["weight_version"] == "0"
        status, data = post(
            url + "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 3}}
        )
        assert status == 200 and data["meta_info"]["completion_tokens"] == 3
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


async def test_the_opd_teacher_client_reads_this_servers_logprobs(
    policies: tuple[Path, Path],
) -> None:
    from pipeline.judge.client import JudgeClient, JudgeConfig

    with embedded_server(policies[0], context_length=64) as (url, _state):
        async with JudgeClient(JudgeConfig(backend="sglang", urls=[url])) as client:
            out = await client.teacher_logprobs(PROMPTS[0] + [7, 8, 9], response_len=3)
    assert len(out["logprobs"]) == 3
    assert all(isinstance(v, float) and v <= 0 for v in out["logprobs"])


def test_a_delta_push_replaces_only_its_tensors_and_needs_the_served_base(
    server: tuple[str, ServerState], policies: tuple[Path, Path], tmp_path: Path
) -> None:
    """The delta of a trainer with its top layer training (save_delta): on the served
    weights it equals the whole perturbed checkpoint in that layer and the old one below;
    for another base it is a 409 and nothing changes."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.training.weights import save_delta

    url, state = server
    base = get(url + "/get_model_info")["weights_base"]
    assert base == f"dir:{policies[0].resolve()}"
    trained = AutoModelForCausalLM.from_pretrained(str(policies[1]), dtype=torch.float32)
    trained.requires_grad_(False)
    trained.model.layers[-1].requires_grad_(True)  # what train_top_layers: 1 trains
    wrong, _ = save_delta(trained, tmp_path / "wrong", 1, "another-run/v000001")
    status, refused = post(url + "/update_weights_from_disk", {"model_path": str(wrong)})
    assert status == 409 and not refused["success"] and "push the whole checkpoint" in str(refused)
    assert state.engine.weights.version == "0"
    path, size = save_delta(trained, tmp_path / "right", 1, base)
    top = dict(trained.model.layers[-1].named_parameters())
    assert size == sum(p.numel() * 4 for p in top.values())
    status, pushed = post(url + "/update_weights_from_disk", {"model_path": str(path)})
    assert status == 200 and pushed["weight_version"] == "1" and pushed["weight_deltas"]
    served = state.engine.weights.model.state_dict()
    old = AutoModelForCausalLM.from_pretrained(str(policies[0]), dtype=torch.float32)
    last = len(trained.model.layers) - 1
    for name, tensor in trained.state_dict().items():
        want = tensor if name.startswith(f"model.layers.{last}.") else old.state_dict()[name]
        assert torch.equal(served[name], want), name
    assert state.engine.weights.base == base  # a delta keeps the base: the next applies too
    assert any(not torch.equal(trained.state_dict()[n], old.state_dict()[n]) for n in served)


def test_a_delta_naming_a_tensor_the_model_lacks_is_refused_with_its_name(
    server: tuple[str, ServerState], tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import save_file

    from pipeline.models.weight_files import DELTA_FILE, DELTA_TENSORS

    url, state = server
    delta = tmp_path / "v000001"
    delta.mkdir()
    save_file({"model.layers.99.mlp.weight": torch.zeros(2)}, str(delta / DELTA_TENSORS))
    (delta / DELTA_FILE).write_text(json.dumps({"base": state.engine.weights.base}))
    status, refused = post(url + "/update_weights_from_disk", {"model_path": str(delta)})
    assert status == 400 and "model.layers.99.mlp.weight" in refused["message"]
    (delta / DELTA_FILE).write_text("[1]")
    status, refused = post(url + "/update_weights_from_disk", {"model_path": str(delta)})
    assert status == 400 and 'expected {"base"' in refused["message"]
    assert state.engine.weights.version == "0"


def test_an_idle_engine_waits_a_moment_for_requests_sent_together(
    server: tuple[str, ServerState],
) -> None:
    """Requests reaching an idle engine one by one, 50 ms apart, within its admission wait,
    decode as one batch from their first token (the wait ends once the batch is full)."""
    from pipeline.serving.jobs import Event, Request
    from pipeline.serving.sampling import Sampling

    _url, state = server
    engine = state.engine
    first_token: dict[int, tuple[int, float]] = {}
    done = threading.Event()

    def emit_for(i: int):  # type: ignore[no-untyped-def]
        def emit(event: Event) -> None:
            if event.kind == "token" and i not in first_token:
                first_token[i] = (engine.steps, time.monotonic())
            if event.kind == "done" and len(first_token) == 3:
                done.set()

        return emit

    wait, running = engine.admit_wait_s, engine.max_running
    engine.admit_wait_s, engine.max_running = 5.0, 3
    try:
        sent = []
        for i in range(3):
            engine.submit(Request(PROMPTS[i], Sampling(max_new_tokens=2, temperature=0.0)),
                          emit_for(i))  # fmt: skip
            sent.append(time.monotonic())
            time.sleep(0.05)
        assert done.wait(60), first_token
    finally:
        engine.admit_wait_s, engine.max_running = wait, running
    assert len({step for step, _at in first_token.values()}) == 1  # one prefill, one batch
    began = min(at for _step, at in first_token.values())
    assert sent[-1] < began < sent[-1] + 4.0  # it waited for the third, not the whole 5 s


def test_prompts_sharing_a_long_prefix_prefill_it_once_and_answer_as_alone(
    server: tuple[str, ServerState], policies: tuple[Path, Path]
) -> None:
    """A batch whose prompts share 40 tokens runs those once and keeps them; a later batch
    starting with them reuses them; greedy answers and their log-probs are those of each
    prompt on a server that keeps nothing."""
    url, state = server
    shared = [5 + (i * 7) % 40 for i in range(40)]
    prompts = [[*shared, 12 + i, *[9, 10, 11][: 1 + i % 3]] for i in range(4)]
    plain = {"temperature": 0, "max_new_tokens": 8}
    with embedded_server(policies[0], context_length=256, prefix_cache_tokens=0) as (bare, nil):
        alone = [generate(bare, p, sampling_params=plain) for p in prompts]  # one at a time
        assert nil.engine.load()["prefix_hits"] == nil.engine.load()["prefix_tokens_kept"] == 0
    status, together = post(url + "/generate", {"input_ids": prompts, "sampling_params": plain,
                                                "return_logprob": True})  # fmt: skip
    assert status == 200
    load = state.engine.load()
    suffixes = sum(len(p) - len(shared) for p in prompts)
    assert load["prefill_tokens"] == len(shared) + suffixes and load["prefix_hits"] == 0
    assert load["finished_kept"] == 4  # each prompt and its answer, for a next turn
    status, again = post(url + "/generate", {"input_ids": prompts[1:], "sampling_params": plain,
                                             "return_logprob": True})  # fmt: skip
    load = state.engine.load()
    assert status == 200 and load["prefix_hits"] == 3
    # each prompt was kept whole with its answer: all of it but the last token is reused
    assert load["prefix_tokens_saved"] == sum(len(p) - 1 for p in prompts[1:])
    for one, batched in zip(alone, together, strict=True):
        assert batched["output_ids"] == one["output_ids"]
        got = [e[0] for e in batched["meta_info"]["output_token_logprobs"]]
        want = [e[0] for e in one["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(want, abs=1e-4)
    assert [a["output_ids"] for a in again] == [a["output_ids"] for a in alone[1:]]


def test_a_sessions_next_turn_starts_from_its_last_prompt_and_answer(
    server: tuple[str, ServerState], policies: tuple[Path, Path]
) -> None:
    """Two sessions' second turns (their first prompt, its answer, a reply) and a new
    prompt in one batch: each turn prefills only what follows its kept prompt and answer
    (rows with starts of different lengths, and one with none), and answers as a server
    that keeps nothing does; after a weight push nothing kept is used."""
    url, state = server
    plain = {"temperature": 0, "max_new_tokens": 6}
    firsts = [[7 + (i * 5) % 31 for i in range(20 + 9 * s)] for s in range(2)]
    answers = [generate(url, p, sampling_params=plain)["output_ids"] for p in firsts]
    turns = [[*p, *a, 3, 4 + s] for s, (p, a) in enumerate(zip(firsts, answers, strict=True))]
    batch = [*turns, [60, 61, 62, 63]]
    with embedded_server(policies[0], context_length=256, prefix_cache_tokens=0) as (bare, _s):
        alone = [generate(bare, p, sampling_params=plain) for p in batch]
    before = state.engine.load()
    status, together = post(url + "/generate", {"input_ids": batch, "sampling_params": plain,
                                                "return_logprob": True})  # fmt: skip
    after = state.engine.load()
    assert status == 200
    assert after["prefix_hits"] - before["prefix_hits"] == 2
    # kept: each first prompt and its answer but the answer's last token (never fed)
    reused = sum(len(p) + len(a) - 1 for p, a in zip(firsts, answers, strict=True))
    assert after["prefix_tokens_saved"] - before["prefix_tokens_saved"] == reused
    assert after["prefill_tokens"] - before["prefill_tokens"] == sum(map(len, batch)) - reused
    for one, batched in zip(alone, together, strict=True):
        assert batched["output_ids"] == one["output_ids"]
        got = [e[0] for e in batched["meta_info"]["output_token_logprobs"]]
        want = [e[0] for e in one["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(want, abs=1e-4)
    status, _ = post(url + "/update_weights_from_disk", {"model_path": str(policies[1])})
    assert status == 200
    hits = state.engine.load()["prefix_hits"]
    generate(url, turns[0], sampling_params=plain)
    assert state.engine.load()["prefix_hits"] == hits  # the new weights' keys differ
