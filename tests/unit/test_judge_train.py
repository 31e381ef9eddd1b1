"""`turnstream judge train` on a tiny random model: examples, the trained layers, the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from pipeline.judge.votes import parse_hint, parse_score
from pipeline.judge_model.build import JUDGE_MANIFEST, read_judge_manifest, train_judge
from pipeline.judge_model.examples import build_examples, hint_answer
from pipeline.judge_model.options import TuneOptions
from pipeline.judge_model.tune import decision_tokens
from pipeline.rewards.agreement import load_gold
from pipeline.training.tiny_tokenizer import make_tiny_tokenizer
from tests.servers import tiny_llama_config

PAIRS = [
    (1, "user", "Thanks, that works!", None),
    (1, "tool", '{"status": "ok", "rows": 3}', None),
    (-1, "user", "No, it is Canberra.", "The capital of Australia is Canberra; answer Canberra."),
    (-1, "tool", "Traceback (most recent call last):\nKeyError: 'id'", None),
    (0, "user", "hmm", None),
    (1, "user", "Great, now sort them by date.", None),
    (-1, "user", "Too long, one sentence please.", "The user wants one sentence; keep it short."),
    (0, "tool", "[output truncated]", None),
]


def gold_line(label: int, role: str, text: str, hint: str | None) -> str:
    answer = "Here is the answer."
    return json.dumps(
        {
            "label": label,
            "agent_output": {
                "messages": [
                    {"role": "user", "content": "Do the task."},
                    {"role": "assistant", "content": answer},
                ]
            },
            "response": {"content": answer},
            "next_state": {"role": role, "content": text},
            "hint": hint,
        }
    )


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with the tiny ChatML tokenizer, saved as a checkpoint directory."""
    root = tmp_path_factory.mktemp("tiny-judge-base")
    corpus = [gold_line(*p) for p in PAIRS] + ["\\boxed{1} \\boxed{0} \\boxed{-1} [HINT_START]"]
    tok_dir = make_tiny_tokenizer(root, corpus=corpus, vocab_size=400)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    torch.manual_seed(0)
    config = tiny_llama_config(
        len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.3,  # logits through the frozen tied head can move within a few steps
    )
    LlamaForCausalLM(config).save_pretrained(str(root))
    return root


@pytest.fixture
def gold(tmp_path: Path) -> Path:
    path = tmp_path / "gold.jsonl"
    path.write_text("\n".join(gold_line(*p) for p in PAIRS) + "\n")
    return path


def test_examples_answer_in_the_form_the_worker_parses(gold: Path, tiny_base: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_base))
    examples = build_examples(load_gold(gold), tok)
    evals = [e for e in examples if e.kind == "eval"]
    hints = [e for e in examples if e.kind == "hint"]
    assert [e.label for e in evals] == [p[0] for p in PAIRS]
    for ex in evals:
        text = tok.decode(ex.answer_ids[:-1])
        assert parse_score(text) == ex.label and ex.answer_ids[-1] == tok.eos_token_id
    # hint examples: the two items with a hint (+1 with it), and the +1 items on odd lines
    # (-1, no hint): here line 1 of lines 1, 2 and 6
    assert sorted(e.label for e in hints) == [-1, 1, 1]
    with_hint = tok.decode(next(e for e in hints if e.label == 1).answer_ids[:-1])
    assert parse_score(with_hint, allowed=(1, -1)) == 1
    assert parse_hint(with_hint) == PAIRS[2][3]
    assert parse_hint(hint_answer(None)) is None


def test_deciding_tokens_differ_per_label(tiny_base: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_base))
    at, tokens = decision_tokens(tok, [1, 0, -1])
    assert at > 0 and len(set(tokens.values())) == 3


def test_training_changes_only_the_top_layers_and_writes_the_manifest(
    gold: Path, tiny_base: Path, tmp_path: Path
) -> None:
    out = tmp_path / "judge"
    lines: list[str] = []
    options = TuneOptions(top_layers=1, epochs=20, batch_size=4, lr=1e-2, seed=1)
    manifest = train_judge(gold, gold, tiny_base, out, options, lines.append, base_name="tiny")
    before = AutoModelForCausalLM.from_pretrained(str(tiny_base)).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(("model.layers.2.", "model.norm.")) for k in changed)
    assert any(k.startswith("model.layers.2.") for k in changed)
    # the manifest says what was trained on, how, and how well
    assert read_judge_manifest(out) == json.loads((out / JUDGE_MANIFEST).read_text()) == manifest
    assert manifest["base"] == "tiny" and manifest["prompt_version"] == "v2"
    assert len(manifest["data"]["gold.jsonl"]) == 64  # sha256 hex
    assert manifest["examples"] == {"eval": 8, "hint": 3}
    assert manifest["steps"] == 20 * (2 + 1)  # eval: 2 batches of 4; hint: 1 batch of 3
    # eight items memorised by the trained layer: the loss fell and the choices follow the labels
    assert manifest["final_loss"] < 0.5 * manifest["first_loss"]
    agreement = manifest["heldout_agreement"]["eval"]
    assert agreement["n"] == 8 and agreement["kappa"] >= 0.8
    assert manifest["heldout_agreement"]["hint"]["n"] == 3
    assert (out / "agreement.txt").read_text().startswith("eval prompt:")
    assert any(line.startswith("training: ") for line in lines)
