"""The initial policy, kept to measure the policy's KL to it at every step (and, with
``kl_coef``, to pull the policy back toward it).

With ``train_top_layers = k`` only the top k decoder layers and the final norm ever change;
the embeddings, the layers below and the output head stay frozen, so the hidden state that
enters the top layers is the same for the policy and for its initial weights.
:class:`TopReference` keeps frozen copies of just those layers and the norm and runs them on
that hidden state, which the policy's own no-grad pass before the update computes anyway
(``output_hidden_states``): the KL costs about k/N of a forward pass, and the copies k/N of
the layers' memory. Every weight training, :class:`FullReference` is a frozen copy of the
whole model, run on its own. Under ZeRO-3 the policy's frozen output head is partitioned and
cannot be called outside its engine, so the full copy serves there too.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import torch

from pipeline.errors import ConfigError
from pipeline.models.decoder import check_transformers, full_attention_only, logits_from
from pipeline.training.batch import MicroBatch
from pipeline.training.config import TrainerConfig
from pipeline.training.losses import window_logprobs
from pipeline.training.top_layers import Frozen, top_output


class Reference(Protocol):
    """The initial policy's log-probs of a micro-batch's next tokens."""

    @property
    def hidden_layer(self) -> int | None:
        """Which of the policy's hidden states it starts from (None: none, it runs whole)."""
        ...

    def logprobs(self, mb: MicroBatch, hidden: Frozen | None) -> torch.Tensor:
        """[B, L-1], from the first response position on (0 before it); ``hidden`` is the
        policy's hidden state number ``hidden_layer``."""
        ...


def frozen_copy(module: torch.nn.Module, device: str) -> torch.nn.Module:
    return copy.deepcopy(module).eval().requires_grad_(False).to(device)


class FullReference:
    """A frozen copy of the whole initial model: one more forward pass per micro-batch."""

    hidden_layer = None

    def __init__(self, model: torch.nn.Module, device: str) -> None:
        self.model = frozen_copy(model, device)

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch, hidden: Frozen | None = None) -> torch.Tensor:
        start = mb.response_from
        _out, logits = logits_from(
            self.model, mb.input_ids, start, attention_mask=mb.attention_mask
        )
        return window_logprobs(logits, mb.input_ids, start)


class TopReference:
    """Frozen copies of the initial top ``top`` decoder layers and final norm, run on the
    policy's hidden state below them, then through the policy's frozen output head."""

    def __init__(self, model: Any, top: int, device: str) -> None:
        check_transformers("the trainer's KL to the initial policy")
        inner = getattr(model, "model", None)
        rotary = getattr(inner, "rotary_emb", None)
        if inner is None or not isinstance(rotary, torch.nn.Module):
            raise ConfigError(
                f"monitor_kl with train_top_layers runs the top layers of a Llama- or "
                f"Qwen2-style model (model.rotary_emb); {type(model).__name__} is not one: set "
                "monitor_kl: false, or unset train_top_layers for a full-copy reference"
            )
        if not full_attention_only(model.config):
            raise ConfigError(
                "monitor_kl with train_top_layers runs full-attention layers only, and this "
                f"model has {sorted(set(model.config.layer_types))}: set monitor_kl: false, or "
                "unset train_top_layers for a full-copy reference"
            )
        self.config = model.config
        self.hidden_layer = len(inner.layers) - top
        self.layers = [frozen_copy(layer, device) for layer in inner.layers[self.hidden_layer :]]
        self.norm = frozen_copy(inner.norm, device)
        self.rotary = frozen_copy(rotary, device)
        self.head = model.get_output_embeddings()  # the policy's: frozen, so the initial one

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch, hidden: Frozen | None) -> torch.Tensor:
        if hidden is None:
            raise ValueError("TopReference.logprobs needs the policy's hidden state")
        # no head over the prompt (what the policy's pass does); a shared prefix run once
        out = top_output(self.config, self.rotary, self.layers, hidden, mb)
        logits = self.head(self.norm(out))
        return window_logprobs(logits, mb.input_ids, mb.response_from)


def build_reference(config: TrainerConfig, model: torch.nn.Module, device: str) -> Reference | None:
    """The reference ``config`` asks for, copied from ``model`` before it trains: none when
    the KL is neither penalised (``kl_coef``) nor monitored (``monitor_kl``)."""
    if not config.kl_coef and not config.monitor_kl:
        return None
    if config.train_top_layers is None or config.zero_stage == 3:
        return FullReference(model, device)
    return TopReference(model, config.train_top_layers, device)
