"""The weights a server answers with: loaded from a HF checkpoint directory, with a version.

A pushed checkpoint names its version in one of three ways, first match wins:
the request's ``weight_version`` (SGLang's field of ``/update_weights_from_disk``);
a ``turnstream-version.json`` beside the weights (``{"version": 12}``); or the
directory's name ``v000012`` (what the trainer's ``save_weights`` writes). A
directory that says nothing gets the previous version plus one (``0`` at start).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.models.convert import ModelError

VERSION_FILE = "turnstream-version.json"
VERSION_DIR = re.compile(r"v(\d+)")


@dataclass
class Weights:
    model: Any
    version: str
    path: str
    loaded_at: float = field(default_factory=time.time)


def version_of(path: Path, given: str | None, previous: str | None) -> str:
    """The version a checkpoint directory names (see the module docstring)."""
    if given:
        return given
    named = path / VERSION_FILE
    if named.is_file():
        try:
            return str(json.loads(named.read_text())["version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError(f'{named}: expected {{"version": N}} ({exc})') from exc
    match = VERSION_DIR.fullmatch(path.name)
    if match:
        return str(int(match.group(1)))
    if previous is None:
        return "0"
    return str(int(previous) + 1) if previous.isdigit() else f"{previous}+1"


def load_model(path: Path, like: Any = None) -> Any:
    """An fp32 causal LM from ``path``; with ``like``, it must be the same architecture."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if not path.is_dir():
        raise ModelError(f"{path}: no such checkpoint directory")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: not a Hugging Face checkpoint ({exc})") from exc
    if like is not None:
        _same_shape(path, config, like.config)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float32, attn_implementation="sdpa"
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelError(f"{path}: the weights could not be loaded ({exc})") from exc
    return model.eval()


def _same_shape(path: Path, new: Any, served: Any) -> None:
    for name in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers"):
        if getattr(new, name, None) != getattr(served, name, None):
            raise ModelError(
                f"{path}: {name} is {getattr(new, name, None)!r} but the served model's is "
                f"{getattr(served, name, None)!r}; a weight update must keep the architecture"
            )
