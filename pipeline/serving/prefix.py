"""Keys and values kept for the prompts that start with their tokens, computed once.

Two kinds of token sequence are kept, each with its keys and values:

- **a shared prefix**: a judge's prompts all start with the same system prompt
  (about 350 of ~450 tokens), and so does every request a chat template renders
  (SmolLM2's is 24 tokens). When the prompts of one prefill share at least
  :data:`MIN_PREFIX` tokens that nothing kept covers, the engine runs them once
  (batch 1) and keeps them;
- **a finished sequence**: a request's prompt and the tokens it generated. An agent's
  session sends its whole conversation again with each turn, so its next request
  starts with the last one's prompt and answer (SGLang keeps these in its radix cache).

A prefill gives each prompt the longest kept start it has (at least
:data:`MIN_PREFIX` tokens, leaving the logits asked for to compute) and runs only the
rest of it (:func:`pipeline.serving.batch.prefill` with ``prefixes``). What is kept
belongs to one set of weights: :meth:`PrefixCache.for_weights` forgets it all when
they change. At most ``tokens`` tokens are kept, the least recently used out first.
The outputs are those of a whole prefill (tested against it): attention over the
kept keys and values is the same.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), [1, heads, n, dim]

# tokens: a shorter shared prefix is not worth a pass of its own. 16 lets a chat template's
# system prompt count (SmolLM2's, up to the user's turn, is 24 tokens, in every request of
# every session): a live-learning step took 9.27 s twice against 11.18 and 10.57 s at 32
MIN_PREFIX = 16
# tokens kept in all: SmolLM2-135M's keys and values take 46 KB a token in fp32, so 8192
# tokens are about 380 MB (sixteen sessions' conversations of ~100 tokens take 1600)
KEPT_TOKENS = 8192


def common_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many tokens ``a`` and ``b`` share from the start (slices compared, not tokens)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while low < high:  # a[:low] == b[:low], a[:high + 1] != b[:high + 1]
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


class PrefixCache:
    """Kept token sequences of one set of weights: token ids -> their keys and values."""

    def __init__(self, tokens: int = KEPT_TOKENS, min_prefix: int = MIN_PREFIX) -> None:
        self.tokens, self.min_prefix = tokens, min_prefix
        self._weights: object | None = None
        self._entries: OrderedDict[tuple[int, ...], Layers] = OrderedDict()
        self.held = 0  # tokens kept now
        self.hits = 0  # prompts that started from kept keys and values
        self.saved_tokens = 0  # prompt tokens not run through the model thanks to them
        self.finished_kept = 0  # finished sequences kept

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: object) -> bool:
        return tokens in self._entries

    def for_weights(self, weights: object) -> PrefixCache:
        if weights is not self._weights:
            self._entries.clear()
            self.held = 0
            self._weights = weights
        return self

    def match(self, prompt: Sequence[int], most: int) -> tuple[tuple[int, ...], int] | None:
        """The kept sequence sharing the longest start with ``prompt`` (at most ``most``
        tokens of it, at least ``min_prefix``) and how many tokens that is; None if none."""
        prompt = tuple(prompt)
        best: tuple[tuple[int, ...], int] | None = None
        for tokens in self._entries:
            n = min(common_length(tokens, prompt), most)
            if n >= self.min_prefix and (best is None or n > best[1]):
                best = (tokens, n)
        if best is not None:
            self._entries.move_to_end(best[0])
        return best

    def shared(self, prompts: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
        """The prompts' common prefix, one token short of the shortest, if long enough to
        keep (several prompts only: one prompt shares nothing yet)."""
        if len(prompts) < 2:
            return None
        first = tuple(prompts[0])
        n = min(len(p) for p in prompts) - 1
        for p in prompts[1:]:
            n = min(n, common_length(first, tuple(p)))
        return first[:n] if n >= self.min_prefix else None

    def layers(self, tokens: tuple[int, ...], n: int) -> Layers:
        """The keys and values of the first ``n`` of a kept sequence's tokens (views)."""
        return [(k[:, :, :n], v[:, :, :n]) for k, v in self._entries[tokens]]

    def put(self, tokens: tuple[int, ...], layers: Layers) -> None:
        """Keep ``tokens``; kept sequences it starts with go (it holds them), and the least
        recently used ones while more than ``self.tokens`` tokens are kept."""
        if len(tokens) > self.tokens or tokens in self._entries:
            return
        covered = [t for t in self._entries if len(t) < len(tokens) and tokens[: len(t)] == t]
        for t in covered:
            del self._entries[t]
            self.held -= len(t)
        self._entries[tokens] = layers
        self.held += len(tokens)
        while self.held > self.tokens:
            gone, _ = self._entries.popitem(last=False)
            self.held -= len(gone)

    def keep_finished(self, weights: object, tokens: tuple[int, ...], layers: Layers) -> None:
        """Keep a finished request's sequence, if it ran on the weights kept for (a row
        still decoding on older weights after a push keeps nothing)."""
        if weights is self._weights and len(tokens) >= self.min_prefix:
            self.put(tokens, layers)
            self.finished_kept += 1


@torch.no_grad()
def run_prefix(model: Any, prefix: tuple[int, ...]) -> Layers:
    """The prefix's keys and values per layer, [1, heads, len, dim] each."""
    from transformers import DynamicCache

    ids = torch.tensor([list(prefix)], dtype=torch.long)
    out = model(input_ids=ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    return [(entry[0], entry[1]) for entry in out.past_key_values]


def row_layers(cache: Any, mask: torch.Tensor, row: int) -> Layers:
    """One row's keys and values from a batch's cache, its padding left out."""
    columns = torch.nonzero(mask[row]).squeeze(1)
    return [
        (entry[0][row : row + 1].index_select(2, columns),
         entry[1][row : row + 1].index_select(2, columns))
        for entry in cache
    ]  # fmt: skip
