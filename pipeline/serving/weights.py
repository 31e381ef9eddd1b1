"""The weights a server answers with: loaded from a HF checkpoint directory, with a version.

A pushed checkpoint names its version in one of three ways, first match wins:
the request's ``weight_version`` (SGLang's field of ``/update_weights_from_disk``);
a ``turnstream-version.json`` beside the weights (``{"version": 12}``); or the
directory's name ``v000012`` (what the trainer's ``save_weights`` writes). A
directory that says nothing gets the previous version plus one (``0`` at start).

A pushed directory is either a whole HF checkpoint or a **delta**: a
``turnstream-delta.json`` manifest beside ``delta.safetensors``, the tensors
that train, named as in the model's ``state_dict``. A delta applies to the
weights of its ``base`` only (the id the whole checkpoint it follows wrote in
``turnstream-base.json``; a directory without one is its own base,
``dir:<real path>``): the server keeps every other tensor as it is.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.models.convert import ModelError
from pipeline.models.weight_files import BASE_FILE, DELTA_FILE, DELTA_TENSORS, VERSION_FILE

VERSION_DIR = re.compile(r"v(\d+)")


@dataclass
class Weights:
    model: Any
    version: str
    path: str
    base: str = ""  # what a delta must name to apply to these weights (see the module docstring)
    loaded_at: float = field(default_factory=time.time)


class BaseMismatch(ModelError):
    """A delta made for other weights than the served ones: push the whole checkpoint."""


def base_of(path: Path) -> str:
    """The base id a whole checkpoint directory gives the weights loaded from it."""
    named = _field(path / BASE_FILE, "base", '{"base": "..."}')
    return named if named is not None else f"dir:{path.resolve()}"


def _field(named: Path, key: str, shape: str) -> str | None:
    """``key`` of the JSON object in ``named`` (None without the file); ModelError saying
    the expected ``shape`` when it is not one."""
    if not named.is_file():
        return None
    try:
        return str(json.loads(named.read_text())[key])
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{named}: expected {shape} ({exc})") from exc


def is_delta(path: Path) -> bool:
    return (path / DELTA_FILE).is_file()


def apply_delta(path: Path, served: Weights) -> Any:
    """A copy of the served model with the delta at ``path``'s tensors in place.

    Every tensor must name one of the model's, with its shape; the delta's base
    must be the served weights' (else :class:`BaseMismatch`). The served model
    is not touched: requests decoding on it finish on it.
    """
    import copy

    import torch
    from safetensors.torch import load_file

    manifest = _delta_manifest(path)
    if manifest["base"] != served.base:
        raise BaseMismatch(
            f"{path}: a delta for base {manifest['base']!r}, but the served weights' base is "
            f"{served.base!r}: push the whole checkpoint"
        )
    try:
        tensors = load_file(str(path / DELTA_TENSORS))
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelError(f"{path / DELTA_TENSORS}: not readable as safetensors ({exc})") from exc
    model = copy.deepcopy(served.model)
    own = model.state_dict()
    for name, tensor in tensors.items():
        if name not in own:
            raise ModelError(f"{path}: the delta's tensor {name!r} is not one of the model's")
        if tuple(own[name].shape) != tuple(tensor.shape):
            raise ModelError(
                f"{path}: the delta's {name} has shape {tuple(tensor.shape)}, the model's "
                f"{tuple(own[name].shape)}"
            )
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)
    return model.eval()


def _delta_manifest(path: Path) -> dict[str, Any]:
    named = path / DELTA_FILE
    try:
        manifest = json.loads(named.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{named}: not readable as JSON ({exc})") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("base"), str):
        raise ModelError(f'{named}: expected {{"base": "...", ...}}, got {manifest!r:.200}')
    return manifest


def version_of(path: Path, given: str | None, previous: str | None) -> str:
    """The version a checkpoint directory names (see the module docstring)."""
    if given:
        return given
    named = _field(path / VERSION_FILE, "version", '{"version": N}')
    if named is not None:
        return named
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
