"""The kept prompt prefixes: which one a batch uses, the common one, the last used kept."""

from __future__ import annotations

import torch

from pipeline.serving.prefix import PrefixCache

KV = [(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))]


def test_the_common_prefix_leaves_a_token_and_must_be_long_enough() -> None:
    cache = PrefixCache(min_prefix=3)
    assert cache.shared([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7]]) == (1, 2, 3, 4)
    assert cache.shared([[1, 2, 3, 4], [1, 2, 3, 4, 9]]) == (1, 2, 3)  # the shortest keeps one
    assert cache.shared([[1, 2, 9], [1, 2, 8]]) is None  # 2 < min_prefix
    assert cache.shared([[1, 2, 3, 4, 5]]) is None  # one prompt shares nothing yet


def test_a_batch_uses_the_longest_kept_prefix_all_its_prompts_start_with() -> None:
    cache = PrefixCache(kept=2, min_prefix=1)
    cache.put((1, 2), KV)
    cache.put((1, 2, 3), KV)
    assert cache.find([[1, 2, 3, 4], [1, 2, 3, 5]]) == (1, 2, 3)
    assert cache.find([[1, 2, 3, 4], [1, 2, 7]]) == (1, 2)
    assert cache.find([[1, 2, 3]]) == (1, 2)  # (1, 2, 3) would leave no token of its own
    assert cache.find([[9, 1, 2]]) is None
    cache.find([[1, 2, 3, 4]])  # (1, 2, 3) used last: (1, 2) is the least recently used
    cache.put((7, 7), KV)
    assert cache.find([[1, 2, 5]]) is None and cache.find([[1, 2, 3, 4]]) == (1, 2, 3)


def test_new_weights_forget_the_kept_prefixes() -> None:
    cache, first, second = PrefixCache(min_prefix=1), object(), object()
    cache.for_weights(first).put((1, 2), KV)
    assert cache.for_weights(first).find([[1, 2, 3]]) == (1, 2)
    assert cache.for_weights(second).find([[1, 2, 3]]) is None


def test_by_default_a_chat_templates_system_prompt_is_kept() -> None:
    # SmolLM2's template up to the user's turn is 24 tokens, the same in every session
    system = list(range(100, 124))
    cache = PrefixCache()
    assert cache.shared([[*system, 1, 2, 3], [*system, 4, 5]]) == tuple(system)
    assert cache.shared([[*system[:15], 1, 2], [*system[:15], 3]]) is None  # under 16 tokens
