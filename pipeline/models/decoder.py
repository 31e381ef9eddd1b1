"""A causal LM's decoder layers run by hand, from a hidden state, as its own forward runs them.

The judge's training runs its trained layers over a shared prefix and packed
suffixes (:mod:`pipeline.judge_model.stack`); the trainer runs a frozen copy of
the policy's top layers from the hidden state the policy computed below them
(:mod:`pipeline.training.reference`). Both call transformers' decoder layers
(Llama and Qwen2 architectures: ``model.model.layers``, ``rotary_emb``, ``norm``)
the way the library's own ``forward`` does. That is its internal calling
convention, so the versions it was tested with are checked
(:func:`check_transformers`) and each caller is tested against the model's own
forward pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
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
