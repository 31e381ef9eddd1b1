"""The keys and values of a prompt prefix many requests share, computed once.

A judge's prompts all start with the same system prompt (about 350 of ~450
tokens); prefilling it for every pair is most of a judge's work on CPU. A chat
template's system prompt is one too, in every request a policy serves. When the
prompts of one prefill share a prefix of at least :data:`MIN_PREFIX` tokens, the
engine runs that prefix once (batch 1), keeps its keys and values here, and
prefills only each prompt's remainder after them (:func:`pipeline.serving.batch.prefill`
with ``prefix``). A later prefill whose prompts all start with a kept prefix reuses
it. Kept prefixes belong to one set of weights: :meth:`PrefixCache.for_weights`
forgets them when the weights change. The outputs are those of a whole prefill
(tested against it), as attention over the kept keys and values is the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

# tokens: a shorter shared prefix is not worth a pass of its own. 16 lets a chat template's
# system prompt count (SmolLM2's, up to the user's turn, is 24 tokens, in every request of
# every session): a live-learning step took 9.27 s twice against 11.18 and 10.57 s at 32
MIN_PREFIX = 16
KEPT = 8  # prefixes kept, least recently used out first


class PrefixCache:
    """Kept prefixes of one set of weights: token ids -> per-layer (keys, values) [1, ...]."""

    def __init__(self, kept: int = KEPT, min_prefix: int = MIN_PREFIX) -> None:
        self.kept, self.min_prefix = kept, min_prefix
        self._weights: object | None = None
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = (
            OrderedDict()
        )
        self.hits = 0  # prefills that reused a kept prefix
        self.saved_tokens = 0  # prompt tokens not run through the model thanks to one

    def for_weights(self, weights: object) -> PrefixCache:
        if weights is not self._weights:
            self._entries.clear()
            self._weights = weights
        return self

    def find(self, prompts: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
        """The longest kept prefix that every prompt starts with, leaving each a token."""
        best: tuple[int, ...] | None = None
        for prefix in self._entries:
            n = len(prefix)
            if (best is None or n > len(best)) and all(
                len(p) > n and tuple(p[:n]) == prefix for p in prompts
            ):
                best = prefix
        if best is not None:
            self._entries.move_to_end(best)
        return best

    def shared(self, prompts: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
        """The prompts' common prefix, one token short of the shortest, if long enough to
        keep (several prompts only: one prompt shares nothing yet)."""
        if len(prompts) < 2:
            return None
        shortest = min(len(p) for p in prompts) - 1
        n = 0
        first = prompts[0]
        while n < shortest and all(p[n] == first[n] for p in prompts):
            n += 1
        return tuple(first[:n]) if n >= self.min_prefix else None

    def get(self, prefix: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self._entries[prefix]

    def put(self, prefix: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._entries[prefix] = layers
        while len(self._entries) > self.kept:
            self._entries.popitem(last=False)


@torch.no_grad()
def run_prefix(model: Any, prefix: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prefix's keys and values per layer, [1, heads, len, dim] each."""
    from transformers import DynamicCache

    ids = torch.tensor([list(prefix)], dtype=torch.long)
    out = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    return [(entry[0], entry[1]) for entry in out.past_key_values]
