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
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipeline.models.decoder import (
    check_transformers,
    full_attention_only,
    run_padded_rows,
)
from pipeline.training.batch import MicroBatch
from pipeline.training.config import TrainerConfig

log = logging.getLogger(__name__)


class TopLayers:
    """The policy's top layers, norm and head, run by hand on a kept hidden state, and the
    frozen layers below them, run by hand to make that state."""

    def __init__(self, top: int, layers: int) -> None:
        self.hidden_layer = layers - top  # the index into output_hidden_states

    def frozen_hidden(self, model: Any, mb: MicroBatch) -> torch.Tensor:
        """[B, L, D]: the embeddings through the frozen layers (``output_hidden_states``'
        entry ``hidden_layer``), without the top layers or the head: the trainer's
        proximal log-probs are the training pass's own (one update a step, so before it
        the weights are those of the pass before the update)."""
        inner = model.model
        hidden = inner.embed_tokens(mb.input_ids)
        below = inner.layers[: self.hidden_layer]
        return run_padded_rows(model.config, inner.rotary_emb, below, hidden, mb.attention_mask)

    def logits(self, model: Any, mb: MicroBatch, hidden: torch.Tensor) -> torch.Tensor:
        """[B, L-1-start, V]: the logits of each next token from ``mb``'s first response
        position (``start``) on, with the top layers' gradient."""
        inner = model.model
        top = inner.layers[self.hidden_layer :]
        out = run_padded_rows(model.config, inner.rotary_emb, top, hidden, mb.attention_mask)
        logits: torch.Tensor = model.get_output_embeddings()(
            inner.norm(out[:, mb.response_from : -1])
        )
        return logits


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
    return TopLayers(config.train_top_layers, len(model.model.layers))


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
