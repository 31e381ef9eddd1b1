"""The kept token sequences: which start a prompt uses, the common one, what is kept, LRU."""

from __future__ import annotations

import random

import torch

from pipeline.serving.prefix import PrefixCache, common_length, row_layers


def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of n tokens whose values are their positions (to see a slice)."""
    k = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)
    return [(k, k + 100)]


def test_the_common_length_of_two_sequences() -> None:
    rng = random.Random(0)
    for _ in range(300):
        a = tuple(rng.choice([1, 2]) for _ in range(rng.randint(0, 12)))
        b = tuple(rng.choice([1, 2]) for _ in range(rng.randint(0, 12)))
        pairs = zip(a, b, strict=False)  # up to the shorter
        want = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(a), len(b)))
        assert common_length(a, b) == want, (a, b)


def test_the_common_prefix_leaves_a_token_and_must_be_long_enough() -> None:
    cache = PrefixCache(min_prefix=3)
    assert cache.shared([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7]]) == (1, 2, 3, 4)
    assert cache.shared([[1, 2, 3, 4], [1, 2, 3, 4, 9]]) == (1, 2, 3)  # the shortest keeps one
    assert cache.shared([[1, 2, 9], [1, 2, 8]]) is None  # 2 < min_prefix
    assert cache.shared([[1, 2, 3, 4, 5]]) is None  # one prompt shares nothing yet


def test_a_prompt_gets_the_longest_start_kept_up_to_what_it_leaves() -> None:
    cache = PrefixCache(min_prefix=2)
    cache.put((1, 2), kv(2))
    cache.put((5, 6, 7, 8), kv(4))
    assert cache.match([1, 2, 3, 4], most=3) == ((1, 2), 2)
    # a kept sequence counts for the part the prompt shares with it, not only as a whole
    assert cache.match([5, 6, 7, 9, 9], most=4) == ((5, 6, 7, 8), 3)
    assert cache.match([5, 6, 7, 8, 9], most=2) == ((5, 6, 7, 8), 2)  # logits asked from 2
    assert cache.match([5, 9], most=1) is None  # under min_prefix
    assert cache.match([9, 1, 2], most=2) is None
    keys, values = cache.layers((5, 6, 7, 8), 3)[0]
    assert keys.flatten().tolist() == [0, 1, 2] and values.flatten().tolist() == [100, 101, 102]


def test_a_longer_sequence_replaces_the_kept_ones_it_starts_with() -> None:
    cache = PrefixCache(min_prefix=1)
    cache.put((1, 2), kv(2))
    cache.put((1, 2, 3, 4), kv(4))
    assert (1, 2) not in cache and (1, 2, 3, 4) in cache and cache.held == 4
    assert cache.match([1, 2, 7], most=2) == ((1, 2, 3, 4), 2)


def test_at_most_its_tokens_are_kept_the_least_recently_used_out_first() -> None:
    cache = PrefixCache(tokens=6, min_prefix=1)
    cache.put((1, 1), kv(2))
    cache.put((2, 2), kv(2))
    cache.put((3, 3), kv(2))
    cache.match([1, 1, 9], most=2)  # (1, 1) used last: (2, 2) is the least recently used
    cache.put((4, 4), kv(2))
    assert (2, 2) not in cache and {(1, 1), (3, 3), (4, 4)} <= set(cache._entries)
    assert cache.held == 6
    cache.put(tuple(range(7)), kv(7))  # longer than the whole cache: not kept
    assert tuple(range(7)) not in cache and cache.held == 6


def test_new_weights_forget_what_was_kept_and_old_rows_keep_nothing() -> None:
    cache, first, second = PrefixCache(min_prefix=1), object(), object()
    cache.for_weights(first).put((1, 2), kv(2))
    assert cache.for_weights(first).match([1, 2, 3], most=2) == ((1, 2), 2)
    assert cache.for_weights(second).match([1, 2, 3], most=2) is None and cache.held == 0
    cache.keep_finished(first, (7, 8, 9), kv(3))  # a row that decoded on the old weights
    assert len(cache) == 0 and cache.finished_kept == 0
    cache.keep_finished(second, (7, 8, 9), kv(3))
    assert (7, 8, 9) in cache and cache.finished_kept == 1


def test_by_default_a_chat_templates_system_prompt_is_kept() -> None:
    # SmolLM2's template up to the user's turn is 24 tokens, the same in every session
    system = list(range(100, 124))
    cache = PrefixCache()
    assert cache.shared([[*system, 1, 2, 3], [*system, 4, 5]]) == tuple(system)
    assert cache.shared([[*system[:15], 1, 2], [*system[:15], 3]]) is None  # under 16 tokens


def test_a_rows_keys_and_values_leave_its_padding_out() -> None:
    # two rows: the first with a column of padding between its prefix and its own tokens
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1]])
    keys = torch.arange(8, dtype=torch.float32).view(2, 1, 4, 1)
    layers = row_layers([(keys, -keys)], mask, 0)
    assert layers[0][0].flatten().tolist() == [0, 1, 3]
    assert layers[0][1].flatten().tolist() == [0, -1, -3]
    assert row_layers([(keys, -keys)], mask, 1)[0][0].flatten().tolist() == [5, 6, 7]
