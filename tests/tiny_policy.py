"""The tiny random Qwen2-style policy the trainer's unit tests build (3 layers, vocab 64)."""

from __future__ import annotations

VOCAB = 64
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
