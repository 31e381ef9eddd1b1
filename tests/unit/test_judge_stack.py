"""The judge's shared-prefix layer runs equal the model's own forward pass (tiny Llama)."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from pipeline.judge_model.examples import shared_prefix
from pipeline.judge_model.stack import Split, answer_logits, frozen_states, packed_mask
from pipeline.models.decoder import causal_mask
from tests.servers import tiny_llama_config


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = tiny_llama_config(64, num_hidden_layers=4, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def test_causal_mask_sees_prefix_and_earlier_suffix_tokens() -> None:
    mask = causal_mask(3, 2)[0, 0]
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


def test_shared_prefix_is_the_longest_common_prefix() -> None:
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert shared_prefix([[7, 8]]) == 2
    assert shared_prefix([]) == 0


def test_prefix_and_suffix_runs_equal_the_full_forward_pass() -> None:
    model = tiny_llama()
    split = Split(model, top=2)
    prefix = [5, 9, 11, 3, 7, 1]
    suffixes = [[4, 4, 8, 2], [6, 10], [12, 13, 14, 15, 16]]  # different lengths: padding
    prefix_state, states = frozen_states(split, prefix, suffixes, pad_id=0, batch=2)
    positions = [[0, 3], [1], [2, 4]]
    with torch.no_grad():
        got = answer_logits(split, prefix_state, states, positions)
        want = []
        for suffix, pos in zip(suffixes, positions, strict=True):
            full = model(input_ids=torch.tensor([prefix + suffix])).logits[0]
            want += [full[len(prefix) + p] for p in pos]
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-4, atol=1e-4)


def test_only_the_top_layers_and_norm_train() -> None:
    model = tiny_llama()
    split = Split(model, top=1)
    names = {n for n, p in model.named_parameters() if any(p is q for q in split.trainable())}
    assert names and all(n.startswith(("model.layers.3.", "model.norm.")) for n in names)


def test_packed_mask_keeps_sequences_apart_and_sees_the_prefix() -> None:
    mask = packed_mask([2, 1], start=1)[0, 0]
    assert mask.tolist() == [
        [True, True, False, False],
        [True, True, True, False],
        [True, False, False, True],
    ]
