"""Forward passes over left-padded batches that share one KV cache (``past_key_values``).

A :class:`Rows` is a set of sequences decoding together: their cache, the
attention mask over its columns (0 = left padding) and the token each feeds
next. Rows prefilled later join by padding both caches to a common length;
finished rows leave by index, and columns that became padding in every row are
cut off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache


@dataclass
class Rows:
    cache: DynamicCache
    mask: torch.Tensor  # [rows, columns], long
    last: torch.Tensor  # [rows], the token each row feeds next

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(entry[0], entry[1]) for entry in cache]


def _pad_left(
    rows: Rows, columns: int
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    extra = columns - rows.mask.shape[1]
    layers = _layers(rows.cache)
    if extra == 0:
        return layers, rows.mask
    padded = [
        (
            torch.nn.functional.pad(k, (0, 0, extra, 0)),
            torch.nn.functional.pad(v, (0, 0, extra, 0)),
        )
        for k, v in layers
    ]
    return padded, torch.nn.functional.pad(rows.mask, (extra, 0))


def join(a: Rows | None, b: Rows) -> Rows:
    """One batch of a's rows then b's, padded on the left to the longer cache."""
    if a is None:
        return b
    columns = max(a.mask.shape[1], b.mask.shape[1])
    layers_a, mask_a = _pad_left(a, columns)
    layers_b, mask_b = _pad_left(b, columns)
    cache = DynamicCache(
        ddp_cache_data=[
            (torch.cat([ka, kb]), torch.cat([va, vb]))
            for (ka, va), (kb, vb) in zip(layers_a, layers_b, strict=True)
        ]
    )
    return Rows(cache, torch.cat([mask_a, mask_b]), torch.cat([a.last, b.last]))


def keep(rows: Rows, indices: list[int]) -> Rows | None:
    """Only ``indices`` of ``rows``, without leading columns that are padding everywhere."""
    if not indices:
        return None
    if len(indices) == rows.size and indices == list(range(rows.size)):
        return rows  # every row goes on: no copy of the cache (most decode steps)
    index = torch.tensor(indices, dtype=torch.long)
    mask = rows.mask[index]
    first = int(torch.nonzero(mask.any(dim=0))[0, 0])
    cache = DynamicCache(
        ddp_cache_data=[(k[index, :, first:], v[index, :, first:]) for k, v in _layers(rows.cache)]
    )
    return Rows(cache, mask[:, first:], rows.last[index])


@torch.no_grad()
def prefill(
    model: Any,
    prompts: list[list[int]],
    pad_id: int,
    keep_logits: int = 1,
    prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None] | None = None,
) -> tuple[Rows, torch.Tensor]:
    """Run the prompts (left-padded) through ``model``; their cache and last ``keep_logits``
    logits per row ([rows, keep_logits, vocab]).

    ``prefixes``: per row, the keys and values ([1, heads, n, dim] per layer) of the tokens
    its prompt starts with, already left out of ``prompts`` (None: the row has none). Each
    row's cache is padding, its prefix, padding, then its own tokens (the padding masked,
    positions counting real tokens only).
    """
    width = max(len(p) for p in prompts)
    rows = len(prompts)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    cache = DynamicCache()
    if prefixes is not None and any(p is not None for p in prefixes):
        cache, kept = _prefix_cache(prefixes)
        mask = torch.cat([kept, mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, mask.shape[1] - width :]
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep_logits,
    )
    last = torch.zeros(rows, dtype=torch.long)
    return Rows(out.past_key_values, mask, last), out.logits


def _prefix_cache(
    prefixes: list[list[tuple[torch.Tensor, torch.Tensor]] | None],
) -> tuple[DynamicCache, torch.Tensor]:
    """The rows' prefixes as one cache, each right-aligned, and its mask [rows, longest]."""
    lengths = [0 if p is None else int(p[0][0].shape[2]) for p in prefixes]
    longest, rows = max(lengths), len(prefixes)
    mask = torch.zeros((rows, longest), dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, longest - n :] = 1
    first = next(p for p in prefixes if p is not None)
    if all(p is first for p in prefixes):  # one prefix for every row (a shared system prompt)
        layers = [
            (k.expand(rows, -1, -1, -1).contiguous(), v.expand(rows, -1, -1, -1).contiguous())
            for k, v in first
        ]
        return DynamicCache(ddp_cache_data=layers), mask
    layers = []
    for layer, (k0, v0) in enumerate(first):
        keys = k0.new_zeros((rows, k0.shape[1], longest, k0.shape[3]))
        values = v0.new_zeros((rows, v0.shape[1], longest, v0.shape[3]))
        for row, prefix in enumerate(prefixes):
            if prefix is not None:
                n = lengths[row]
                keys[row, :, longest - n :] = prefix[layer][0][0]
                values[row, :, longest - n :] = prefix[layer][1][0]
        layers.append((keys, values))
    return DynamicCache(ddp_cache_data=layers), mask


@torch.no_grad()
def decode(model: Any, rows: Rows) -> torch.Tensor:
    """Feed each row's ``last`` token; cache and mask grow a column. Logits [rows, vocab]."""
    positions = rows.mask.sum(dim=-1, keepdim=True)
    rows.mask = torch.cat([rows.mask, torch.ones((rows.size, 1), dtype=torch.long)], dim=1)
    out = model(
        input_ids=rows.last[:, None],
        attention_mask=rows.mask,
        position_ids=positions,
        past_key_values=rows.cache,
        use_cache=True,
    )
    rows.cache = out.past_key_values
    logits: torch.Tensor = out.logits[:, -1]
    return logits
