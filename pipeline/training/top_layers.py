"""The trained top layers run from the frozen layers' output, which is computed once a step.

With ``train_top_layers = k`` the layers below the top k never change, so their output for
a micro-batch is the same in the pass before the update and in the pass that trains. The
pass before the update runs the embeddings and the frozen layers alone
(:meth:`TopLayers.frozen_hidden`, in eval mode); :class:`TopLayers` runs only the policy's
own top k layers, final norm and output head, with their gradient, on that hidden state:
the training pass costs about k/N of a forward pass instead of a whole one, and its
log-probs, detached, are the proximal ones (a step makes one update, after every pass). A
model with dropout (any ``*dropout`` or ``*pdrop`` setting above 0) would apply it in the
training pass, or one that scales its embeddings would differ from the layers run by hand,
so such a model trains whole.

Rows that start alike (:attr:`MicroBatch.shared_prefix`: every learn sample starts with the
chat template's system prompt) have those tokens run once: the frozen layers' output is
:class:`~pipeline.models.decoder.Prefixed`, the prefix's once and each row's rest, and the
top layers (the policy's, with their gradient, and the reference's) run it the same way,
the prefix's keys and values in front of each row's (sdpa attention only; tested against
the whole pass).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.models.decoder import (
    Prefixed,
    can_share_prefix,
    check_transformers,
    full_attention_only,
    run_padded_rows,
    run_prefixed,
)
from pipeline.training.batch import MicroBatch
from pipeline.training.config import TrainerConfig

log = logging.getLogger(__name__)


Frozen = torch.Tensor | Prefixed  # the frozen layers' output: [B, L, D], or shared once


class TopLayers:
    """The policy's top layers, norm and head, run by hand on a kept hidden state, and the
    frozen layers below them, run by hand to make that state."""

    def __init__(self, top: int, layers: int, share_prefix: bool = True) -> None:
        self.hidden_layer = layers - top  # the index into output_hidden_states
        self.share_prefix = share_prefix  # rows that start alike run that start once
        self.shared_positions = 0  # positions not run per row thanks to it (frozen pass)

    def frozen_hidden(self, model: Any, mb: MicroBatch) -> Frozen:
        """The embeddings through the frozen layers (``output_hidden_states``' entry
        ``hidden_layer``: [B, L, D], or :class:`Prefixed` when the rows share a prefix),
        without the top layers or the head: the trainer's proximal log-probs are the
        training pass's own (one update a step, so before it the weights are those of the
        pass before the update)."""
        inner = model.model
        below = inner.layers[: self.hidden_layer]
        start = mb.shared_prefix if self.share_prefix else 0
        if start:
            states = Prefixed(
                inner.embed_tokens(mb.input_ids[:1, :start]),
                inner.embed_tokens(mb.input_ids[:, start:]),
            )
            self.shared_positions += (mb.input_ids.shape[0] - 1) * start
            return run_prefixed(inner.rotary_emb, below, states)
        hidden = inner.embed_tokens(mb.input_ids)
        return run_padded_rows(model.config, inner.rotary_emb, below, hidden, mb.attention_mask)

    def logits(self, model: Any, mb: MicroBatch, hidden: Frozen) -> torch.Tensor:
        """[B, L-1-start, V]: the logits of each next token from ``mb``'s first response
        position (``start``) on, with the top layers' gradient."""
        inner = model.model
        top = inner.layers[self.hidden_layer :]
        out = top_output(model.config, inner.rotary_emb, top, hidden, mb)
        logits: torch.Tensor = model.get_output_embeddings()(inner.norm(out))
        return logits


def top_output(
    config: Any,
    rotary: torch.nn.Module,
    layers: Any,
    hidden: Frozen,
    mb: MicroBatch,
) -> torch.Tensor:
    """``layers``' output [B, L-1-start, D] at ``mb``'s positions from its first response
    position (``start``) on, but the last, from the frozen layers' output ``hidden``."""
    if isinstance(hidden, Prefixed):  # the prefix ends at or before the first response
        out = run_prefixed(rotary, layers, hidden).rows
        return out[:, mb.response_from - hidden.start : -1]
    out = run_padded_rows(config, rotary, layers, hidden, mb.attention_mask)
    return out[:, mb.response_from : -1]


def build_top_layers(config: TrainerConfig, model: Any) -> TopLayers | None:
    """TopLayers when ``config`` trains the top layers only and ``model`` can be run so;
    None (the whole forward pass each time), with the reason logged, otherwise."""
    if config.train_top_layers is None or not config.train_from_frozen_states:
        return None
    reason = _cannot(config, model)
    if reason:
        log.info("training pass: the whole model each time (%s)", reason)
        return None
    check_transformers("training the top layers from the frozen layers' output")
    share = can_share_prefix(model.config)
    if not share:
        log.info("training pass: rows that start alike run their start each (not sdpa)")
    return TopLayers(config.train_top_layers, len(model.model.layers), share)


def _cannot(config: TrainerConfig, model: Any) -> str | None:
    """Why the top layers cannot be run on their own here (None: they can)."""
    if config.zero_stage == 3:
        return "ZeRO-3 partitions the parameters: only the engine's forward gathers them"
    inner = getattr(model, "model", None)
    if inner is None or not isinstance(getattr(inner, "rotary_emb", None), torch.nn.Module):
        return f"{type(model).__name__} is not a Llama- or Qwen2-style model"
    if not full_attention_only(model.config):
        return "the model has sliding-window layers"
    settings = model.config.to_dict()
    dropouts = {
        name: value
        for name, value in settings.items()
        if name.endswith(("dropout", "pdrop")) and isinstance(value, (int, float)) and value > 0
    }
    if dropouts:
        return f"the model has dropout ({', '.join(sorted(dropouts))}), which training applies"
    if settings.get("embedding_multiplier", 1.0) not in (None, 1.0):
        return "the model scales its embeddings (embedding_multiplier)"
    return None
