"""Decode throughput: `turnstream serve` with N requests in flight vs one static `generate`.

The same N chat prompts (SmolLM2-135M-Instruct, chat-templated), sampled at
temperature 1.0 for exactly T new tokens each (``ignore_eos`` / ``min_new_tokens``):

- **generate**: plain transformers ``model.generate`` on the N prompts as one
  left-padded batch, in this process (torch with the same thread count);
- **serve**: a `turnstream serve` process, N concurrent ``/generate`` requests
  sent at once from N threads; the clock runs from the first send to the last answer.

Tokens/s = N x T / seconds; the median of ``--repeat`` alternated rounds. The
server's own figures (``/get_model_info`` load: widest batch, loop time) are
kept beside. Prints a table, writes benchmarks/results/serve_decode.json.

    python benchmarks/serve_decode.py [--requests 16] [--tokens 48] [--repeat 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import spawn, stop, wait_http, write_result

from pipeline.broker.local import free_port_pair
from pipeline.models import ensure_model

QUESTIONS = ["What is the capital of France?", "Name three colours.", "What is 12 times 3?",
             "Why is the sky blue?", "Give me a short greeting.", "What is a comet?",
             "How many legs has a spider?", "What is the opposite of hot?"]  # fmt: skip


def prompt_ids(tokenizer: object, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)  # type: ignore[attr-defined]
        prompts.append(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
    return prompts


def with_generate(model: object, prompts: list[list[int]], tokens: int, pad: int) -> float:
    """Seconds for one static batch of ``prompts`` to produce ``tokens`` each."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(  # type: ignore[attr-defined]
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    assert out.shape[1] - width == tokens, out.shape
    return seconds


def with_server(url: str, prompts: list[list[int]], tokens: int) -> float:
    """Seconds from sending ``prompts`` at once to the last answer, each ``tokens`` long."""
    answers: list[int] = []
    gate = threading.Barrier(len(prompts) + 1)

    def one(p: list[int]) -> None:
        body = {"input_ids": p, "sampling_params": {"temperature": 1.0, "max_new_tokens": tokens,
                                                   "ignore_eos": True}}  # fmt: skip
        request = urllib.request.Request(
            url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        gate.wait()
        with urllib.request.urlopen(request, timeout=600) as response:
            answers.append(json.loads(response.read())["meta_info"]["completion_tokens"])

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    gate.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - started
    assert answers == [tokens] * len(prompts), answers
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    path = ensure_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    prompts = prompt_ids(tokenizer, args.requests)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    port = free_port_pair()
    log = Path(tempfile.mkdtemp(prefix="serve-decode-")) / "serve.log"
    server = spawn(["pipeline.cli", "serve", "--model", str(path), "--port", str(port),
                    "--threads", str(args.threads), "--loglevel", "warning"],
                   dict(os.environ), log)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", server, log)
        with_server(url, prompts[:2], 4)  # warm both paths up
        with_generate(model, prompts[:2], 4, pad)
        rounds: dict[str, list[float]] = {"generate": [], "serve": []}
        for _ in range(args.repeat):
            rounds["generate"].append(with_generate(model, prompts, args.tokens, pad))
            rounds["serve"].append(with_server(url, prompts, args.tokens))
        with urllib.request.urlopen(url + "/get_model_info", timeout=30) as response:
            load = json.loads(response.read())["load"]
    finally:
        stop(server)
    total = args.requests * args.tokens
    rates = {k: total / statistics.median(v) for k, v in rounds.items()}
    print(f"{args.requests} requests x {args.tokens} tokens, {args.threads} threads")
    print(f"{'how':10} {'tokens/s':>9} {'seconds (each round)':>30}")
    for how, seconds in rounds.items():
        print(f"{how:10} {rates[how]:9.1f} {', '.join(f'{s:.2f}' for s in seconds):>30}")
    ratio = rates["serve"] / rates["generate"]
    print(f"serve / generate: {ratio:.3f} (goal >= 1.0); server's widest batch "
          f"{load.get('widest_batch')}")  # fmt: skip
    write_result("serve_decode", {"requests": args.requests, "tokens": args.tokens,
                                  "threads": args.threads, "seconds": rounds,
                                  "tokens_per_s": rates, "serve_over_generate": ratio,
                                  "server_load": load})  # fmt: skip


if __name__ == "__main__":
    main()
