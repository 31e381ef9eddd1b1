"""The embedded server in tests: tiny random policies on disk, an in-process server, raw HTTP."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from pipeline.serving.run import open_state, serving_in_thread
from pipeline.serving.server import ServerState
from pipeline.settings import ServeSettings


def tiny_llama_config(vocab_size: int, **overrides: Any) -> Any:
    """A small random Llama's config: 2 layers of width 48 unless ``overrides`` say more."""
    from transformers import LlamaConfig

    sizes: dict[str, Any] = {
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }
    return LlamaConfig(vocab_size=vocab_size, **{**sizes, **overrides})


def make_tiny_policy(
    out: Path, tokenizer_dir: Path, seed: int = 0, noise: float = 0.0, unused_ids: int = 0
) -> Path:
    """A 2-layer random Llama with the tiny tokenizer, saved like a trainer's checkpoint.

    ``noise``: the seed's weights plus Gaussian noise of that scale (a "trained" copy);
    ``unused_ids``: that many vocabulary ids beyond the tokenizer's (a padded output head).
    """
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = tiny_llama_config(
        len(tokenizer) + unused_ids,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if noise:
        generator = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * noise)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for item in tokenizer_dir.iterdir():
        if item.is_file():
            shutil.copy(item, out / item.name)
    return out


@contextmanager
def embedded_server(model: Path | str, **options: Any) -> Iterator[tuple[str, ServerState]]:
    """The embedded server on ``model``, in this process; yields (base URL, its state)."""
    state = open_state(ServeSettings(model=str(model), **options))
    try:
        with serving_in_thread(state) as url:
            yield url, state
    finally:
        state.engine.stop()


def post(url: str, body: Any, timeout: float = 120.0) -> tuple[int, Any]:
    """POST JSON (or raw bytes); (status, decoded JSON body)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def get(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read() or b"null")
