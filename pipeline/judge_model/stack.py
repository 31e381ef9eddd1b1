"""The judge's layers run with the prompts' shared prefix computed once.

Every eval prompt starts with the same system prompt (about 350 of its ~450
tokens), and so does every hint prompt. Training the top layers only, the
frozen layers' output for a prompt never changes: it is computed once per
example (:func:`frozen_states`), and for the shared prefix once per kind. Each
training step runs the trained layers over the prefix once (batch 1, with its
gradient) and over the batch's suffixes packed into one row, each with the
prefix's keys and values in front (:class:`PrefixKV`) and a mask that keeps the
suffixes apart, then the output head on the answer positions only.

Transformers' attention asks its cache for one thing, ``update(key, value,
layer_idx)``, returning the keys and values to attend to: :class:`PrefixKV`
answers it. That is the library's internal calling convention, so the
versions it was tested with are checked (:mod:`pipeline.models.decoder`, which
runs the layers, and :func:`~pipeline.models.decoder.check_transformers`) and
the result is tested against the model's own forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.errors import TurnstreamError
from pipeline.models.decoder import PrefixKV, run_after_prefix, run_decoder_layers


def run_layers(
    model: Any, layers: Sequence[torch.nn.Module], hidden: torch.Tensor, start: int, kv: PrefixKV
) -> torch.Tensor:
    """``hidden`` [B, S, D] at positions start.., through ``layers``, after ``kv``'s prefix."""
    return run_after_prefix(model.model.rotary_emb, layers, hidden, start, kv)


def packed_mask(lengths: Sequence[int], start: int) -> torch.Tensor:
    """[1, 1, T, start + T] bool for sequences of ``lengths`` packed into one row of T tokens:
    a token sees the prefix, and the tokens of its own sequence up to itself."""
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths)))
    index = torch.arange(segment.shape[0])
    own = (segment[:, None] == segment[None, :]) & (index[None, :] <= index[:, None])
    prefix = torch.ones(segment.shape[0], start, dtype=torch.bool)
    return torch.cat([prefix, own], dim=1)[None, None]


def run_packed(
    model: Any,
    layers: Sequence[torch.nn.Module],
    hidden: torch.Tensor,
    lengths: Sequence[int],
    start: int,
    kv: PrefixKV,
) -> torch.Tensor:
    """Sequences of ``lengths`` packed in ``hidden`` [1, T, D], each at positions start..,
    through ``layers`` after ``kv``'s prefix: as if each ran alone, with no padding."""
    positions = torch.cat([torch.arange(start, start + n) for n in lengths])[None]
    mask = packed_mask(lengths, start)
    return run_decoder_layers(model.model.rotary_emb, layers, hidden, positions, mask, kv)


@dataclass
class Split:
    """Which decoder layers stay frozen and which train."""

    model: Any
    top: int

    def __post_init__(self) -> None:
        layers = self.model.model.layers
        if not 1 <= self.top <= len(layers):
            raise TurnstreamError(f"train top layers: 1..{len(layers)}, got {self.top}")
        if self.model.config._attn_implementation != "sdpa":
            raise TurnstreamError("judge training needs the model loaded with sdpa attention")

    @property
    def frozen(self) -> list[torch.nn.Module]:
        layers = self.model.model.layers
        return list(layers[: len(layers) - self.top])

    @property
    def trained(self) -> list[torch.nn.Module]:
        layers = self.model.model.layers
        return list(layers[len(layers) - self.top :])

    def trainable(self) -> list[torch.nn.Parameter]:
        """The trained layers and the final norm (the tied output head stays frozen)."""
        self.model.requires_grad_(False)
        for layer in self.trained:
            layer.requires_grad_(True)
        self.model.model.norm.requires_grad_(True)
        return [p for p in self.model.parameters() if p.requires_grad]


@torch.no_grad()
def frozen_states(
    split: Split,
    prefix: list[int],
    suffixes: Sequence[list[int]],
    pad_id: int,
    batch: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The frozen layers' output: for the prefix [1, P, D], and each suffix [S_i, D]
    (``on_batch`` is told how many suffixes each batch finished)."""
    embed = split.model.model.embed_tokens
    kv = PrefixKV()
    prefix_out = run_layers(split.model, split.frozen, embed(torch.tensor([prefix])), 0, kv)
    kv.recording = False
    order = sorted(range(len(suffixes)), key=lambda i: len(suffixes[i]))
    states: dict[int, torch.Tensor] = {}
    for at in range(0, len(order), batch):
        chunk = order[at : at + batch]
        width = max(len(suffixes[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, : len(suffixes[i])] = torch.tensor(suffixes[i])
        hidden = run_layers(split.model, split.frozen, embed(ids), len(prefix), kv)
        for row, i in enumerate(chunk):
            states[i] = hidden[row, : len(suffixes[i])].clone()
        if on_batch is not None:
            on_batch(len(chunk))
    out = [states[i] for i in range(len(suffixes))]
    return prefix_out, out


def answer_logits(
    split: Split,
    prefix_state: torch.Tensor,
    suffix_states: Sequence[torch.Tensor],
    positions: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Logits [sum of len(positions[i]), V] at the given suffix positions of each example,
    through the trained layers, the final norm and the output head. The suffixes run packed
    into one row (no padding: they differ in length by a factor of two or more). The row's
    attention grows with the square of the batch's tokens, where padded rows grow with the
    batch times the longest squared: at a judge's 8-16 suffixes of ~100 tokens that costs
    less than the padding it saves (benchmarks/judge_step.py)."""
    kv = PrefixKV()
    run_layers(split.model, split.trained, prefix_state, 0, kv)
    kv.recording = False
    lengths = [s.shape[0] for s in suffix_states]
    hidden = torch.cat(list(suffix_states))[None]
    out = run_packed(split.model, split.trained, hidden, lengths, prefix_state.shape[1], kv)
    starts = [sum(lengths[:row]) for row in range(len(lengths))]
    picked = torch.tensor([starts[row] + c for row, pos in enumerate(positions) for c in pos])
    return split.model.lm_head(split.model.model.norm(out[0, picked]))
