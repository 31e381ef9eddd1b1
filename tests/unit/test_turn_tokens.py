"""A reply the chat template cannot render is tokenised as plain text, counted and logged."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pipeline.events import Response
from pipeline.turn_tokens import response_token_ids

MESSAGES = [{"role": "user", "content": "run the tests"}]
REPLY = Response(content="All 42 tests passed.")

# Refuses assistant turns in the history, as templates do for roles or tool calls they lack.
REFUSING = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ raise_exception('assistant turns are not supported') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Opens a think block in the generation prompt only, so the history does not extend it.
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def tokenizer(path: Path, template: str | None = None) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if template is not None:
        tok.chat_template = template
    return tok


def fallbacks(reason: str) -> float:
    labels = {"reason": reason}
    return REGISTRY.get_sample_value("turnstream_turn_tokens_plain_text_total", labels) or 0.0


@pytest.mark.parametrize(
    ("template", "reason", "why"),
    [
        (REFUSING, "render_failed", "assistant turns are not supported"),
        (THINKING, "prompt_mismatch", "does not extend the prompt's"),
    ],
)
def test_a_reply_the_template_cannot_render_is_counted_and_logged(
    tiny_tokenizer: Path, caplog: pytest.LogCaptureFixture, template: str, reason: str, why: str
) -> None:
    tok = tokenizer(tiny_tokenizer, template)
    before = {r: fallbacks(r) for r in ("render_failed", "prompt_mismatch")}
    ids = response_token_ids(tok, MESSAGES, REPLY, tools=None)
    plain = tok.encode("All 42 tests passed.", add_special_tokens=False)
    assert ids == [*plain, tok.eos_token_id]  # the plain text's tokens and the end of turn
    after = {r: fallbacks(r) for r in before}
    assert after == {r: n + (r == reason) for r, n in before.items()}
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert why in warning.getMessage() and "plain text" in warning.getMessage()


def test_a_reply_the_template_renders_is_no_fallback(
    tiny_tokenizer: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tok = tokenizer(tiny_tokenizer)  # its own ChatML template
    before = fallbacks("render_failed") + fallbacks("prompt_mismatch")
    ids = response_token_ids(tok, MESSAGES, REPLY, tools=None)
    assert tok.decode(ids) == "All 42 tests passed.<|im_end|>"
    assert fallbacks("render_failed") + fallbacks("prompt_mismatch") == before
    assert not caplog.records
