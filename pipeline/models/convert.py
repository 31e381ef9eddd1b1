"""GGUF to a plain Hugging Face checkpoint (fp32 safetensors, tokenizer, chat template)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import TurnstreamError
from pipeline.models.catalog import ModelSpec

CONVERSION = 1  # bump when the conversion changes: older caches are converted again


class ModelError(TurnstreamError):
    """A model could not be fetched, checked, converted or loaded."""


def convert_gguf(
    gguf: Path, out_dir: Path, spec: ModelSpec, log: Callable[[str], None]
) -> dict[str, Any]:
    """Dequantise ``gguf`` with transformers' GGUF loader and save it under ``out_dir``.

    ``save_pretrained`` refuses a model that still carries the GGUF
    ``quantization_config``, so the weights move into a fresh model of the same
    config without it. The tokenizer's eos and pad become the chat template's
    end-of-turn token (the GGUF's tokenizer names ``<|im_start|>``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as exc:
        raise ModelError(
            f"converting {gguf.name} needs the gguf and accelerate packages ({exc}); "
            "install them with `pip install gguf accelerate` (turnstream depends on both)"
        ) from exc
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    end_id = tokenizer.convert_tokens_to_ids(spec.end_of_turn)
    if not isinstance(end_id, int) or end_id == tokenizer.unk_token_id:
        raise ModelError(f"{gguf.name}: the tokenizer has no {spec.end_of_turn!r} token")
    tokenizer.eos_token = spec.end_of_turn
    tokenizer.pad_token = spec.end_of_turn
    tokenizer.clean_up_tokenization_spaces = False  # it would strip spaces BPE pieces carry
    model.config.eos_token_id = end_id
    model.config.pad_token_id = end_id
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = end_id
    log(f"saving the fp32 checkpoint to {out_dir}")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return {
        "conversion": CONVERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "architecture": type(model).__name__,
        "eos_token": spec.end_of_turn,
        "eos_token_id": end_id,
    }
