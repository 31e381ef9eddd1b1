"""A tiny byte-level BPE tokenizer with a ChatML template, built locally.

The trainer's tokenizer when its config names no model (CPU training, the
recorded demo); the tests build theirs with it too, since nothing can be
downloaded there. Trained in a second on the shipped example sessions, saved
as a normal Hugging Face tokenizer directory, and loaded by path like a real one.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% elif m['content'] %}"
    "{% for part in m['content'] %}{{ part.get('text', '') }}{% endfor %}{% endif %}"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>"
    "{{ c['function']['name'] }}({{ c['function']['arguments'] }})</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tiny_tokenizer(
    out_dir: Path, corpus: list[str] | None = None, vocab_size: int = 512
) -> Path:
    """Train and save the tokenizer under ``out_dir``; return the directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if corpus is None:
        examples = Path(__file__).resolve().parents[2] / "examples" / "sessions.jsonl"
        corpus = examples.read_text().splitlines() if examples.exists() else ["hello world"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return out_dir
