"""A causal LM's decoder layers run by hand, from a hidden state, as its own forward runs them.

The judge's training runs its trained layers over a shared prefix and packed
suffixes (:mod:`pipeline.judge_model.stack`); the trainer runs the policy's top
layers, and a frozen copy of them, from the hidden state the policy computed
below them (:mod:`pipeline.training.top_layers`, :mod:`pipeline.training.reference`),
the prefix its rows share once (:class:`Prefixed`). Both call transformers' decoder layers
(Llama and Qwen2 architectures: ``model.model.layers``, ``rotary_emb``, ``norm``)
the way the library's own ``forward`` does. That is its internal calling
convention, so the versions it was tested with are checked
(:func:`check_transformers`) and each caller is tested against the model's own
forward pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.errors import TurnstreamError

# major versions whose decoder layers take (hidden, attention_mask, position_ids,
# past_key_values, position_embeddings) and whose attention calls cache.update(k, v, layer_idx)
TESTED_TRANSFORMERS = (5,)


def check_transformers(what: str) -> None:
    """TurnstreamError naming ``what`` when the installed transformers is not a tested one."""
    import transformers

    major = int(transformers.__version__.split(".")[0])
    if major not in TESTED_TRANSFORMERS:
        raise TurnstreamError(
            f"{what} runs transformers' decoder layers one by one, tested with "
            f"transformers {TESTED_TRANSFORMERS} (major); {transformers.__version__} is "
            "installed: install transformers 5.x"
        )


def run_decoder_layers(
    rotary: torch.nn.Module,
    layers: Sequence[torch.nn.Module],
    hidden: torch.Tensor,
    positions: torch.Tensor,
    mask: Any,
    cache: Any = None,
) -> torch.Tensor:
    """``hidden`` [B, S, D] at ``positions`` [1, S] through ``layers``, attending as ``mask``
    says (None: plain causal), with ``cache`` (an object with ``update(k, v, layer_idx)``) or
    none; ``rotary`` is the model's rotary embedding module."""
    embeddings = rotary(hidden, positions)
    for layer in layers:
        hidden = layer(
            hidden,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            position_embeddings=embeddings,
        )
    return hidden


def run_padded_rows(
    config: Any,
    rotary: torch.nn.Module,
    layers: Sequence[torch.nn.Module],
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """``hidden`` [B, S, D] of right-padded rows (``attention_mask`` [B, S]) through
    ``layers`` from position 0, causal, as the model's forward runs them."""
    positions = torch.arange(hidden.shape[1], device=hidden.device)[None]
    mask = padded_causal_mask(config, hidden, attention_mask, positions)
    return run_decoder_layers(rotary, layers, hidden, positions, mask)


class PrefixKV:
    """The shared prefix's keys and values per layer, put in front of a suffix's own.

    Recording (the prefix's pass), ``update`` keeps each layer's keys and values;
    reading (a suffix's pass), it returns them expanded to the suffix's batch and
    joined with the suffix's. Written and read by one thread, in one forward pass.
    """

    def __init__(self) -> None:
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.recording = True

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *_: Any, **__: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.recording:
            self.keys[layer_idx], self.values[layer_idx] = key, value
            return key, value
        batch = key.shape[0]
        k = self.keys[layer_idx].expand(batch, -1, -1, -1)
        v = self.values[layer_idx].expand(batch, -1, -1, -1)
        return torch.cat([k, key], dim=2), torch.cat([v, value], dim=2)


def causal_mask(length: int, start: int, device: Any = None) -> torch.Tensor:
    """[1, 1, length, start + length] bool: a suffix token sees the prefix and what precedes it."""
    rows = torch.arange(length, device=device)[:, None]
    cols = torch.arange(start + length, device=device)[None, :]
    return (cols < start + rows + 1)[None, None]


def run_after_prefix(
    rotary: torch.nn.Module,
    layers: Sequence[torch.nn.Module],
    hidden: torch.Tensor,
    start: int,
    kv: PrefixKV,
) -> torch.Tensor:
    """``hidden`` [B, S, D] at positions start.., through ``layers``, after ``kv``'s prefix
    (recording: ``hidden`` is the prefix, ``start`` 0). Right padding needs no mask of its
    own: no token before it attends to it."""
    positions = torch.arange(start, start + hidden.shape[1], device=hidden.device)[None]
    mask = causal_mask(hidden.shape[1], start, hidden.device)
    return run_decoder_layers(rotary, layers, hidden, positions, mask, kv)


@dataclass
class Prefixed:
    """A hidden state of right-padded rows that share their first tokens, kept as the
    shared prefix's once ([1, P, D]) and each row's rest ([B, L - P, D])."""

    prefix: torch.Tensor
    rows: torch.Tensor

    @property
    def start(self) -> int:
        return int(self.prefix.shape[1])


def run_prefixed(
    rotary: torch.nn.Module, layers: Sequence[torch.nn.Module], states: Prefixed
) -> Prefixed:
    """``states`` through ``layers``: the prefix once, then the rows after its keys and
    values, as a whole pass over the rows runs them (sdpa attention: a boolean mask)."""
    kv = PrefixKV()
    prefix = run_after_prefix(rotary, layers, states.prefix, 0, kv)
    kv.recording = False
    return Prefixed(prefix, run_after_prefix(rotary, layers, states.rows, states.start, kv))


def can_share_prefix(config: Any) -> bool:
    """Whether rows can be run after a shared prefix (:func:`run_prefixed`): its boolean
    mask is sdpa's form, and one mask serves every layer."""
    return getattr(config, "_attn_implementation", None) == "sdpa" and full_attention_only(config)


def padded_causal_mask(
    config: Any, hidden: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> Any:
    """The causal mask over right-padded rows (``attention_mask`` [B, S], 1 = a token) in the
    form ``config``'s attention implementation takes, the one the model's forward makes: a
    tensor, None (no padding: plain causal) or flex attention's block mask."""
    from transformers.masking_utils import create_causal_mask

    return create_causal_mask(
        config=config,
        inputs_embeds=hidden,
        attention_mask=attention_mask,
        past_key_values=None,
        position_ids=positions,
    )


def full_attention_only(config: Any) -> bool:
    """Whether every layer of ``config`` attends over the whole sequence (no sliding window),
    so one causal mask serves them all."""
    types = getattr(config, "layer_types", None) or ["full_attention"]
    return set(types) == {"full_attention"}


def logits_from(model: Any, input_ids: torch.Tensor, start: int, **kwargs: Any) -> tuple[Any, Any]:
    """``model``'s forward over ``input_ids`` [B, L] with its output head run on positions
    ``start``.. only (``logits_to_keep``, where the model's forward takes it): (the output,
    the logits [B, L - 1 - start, V] of each next token from position ``start``). Over a 49k
    vocabulary the head costs as much per position as several decoder layers, and the
    positions before the first response token need none."""
    keep = input_ids.shape[1] - start
    module = getattr(model, "module", model)  # a DeepSpeed engine passes keywords through
    if _keeps_logits(module):
        kwargs["logits_to_keep"] = keep
    out = model(input_ids=input_ids, **kwargs)
    return out, out.logits[:, -keep:-1]


_KEEPS_LOGITS: dict[type, bool] = {}  # model class -> its forward takes logits_to_keep


def _keeps_logits(module: Any) -> bool:
    """Whether ``module``'s forward takes ``logits_to_keep`` (asked once a class)."""
    cls = type(module)
    if cls not in _KEEPS_LOGITS:
        _KEEPS_LOGITS[cls] = "logits_to_keep" in inspect.signature(cls.forward).parameters
    return _KEEPS_LOGITS[cls]
