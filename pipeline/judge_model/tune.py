"""`turnstream judge train`: fine-tune the top layers of a base model into a judge.

The frozen layers' output of every example is computed once (the prompts'
shared system prefix once per prompt kind); then each epoch trains the top
layers and the final norm through DeepSpeed (CPU: gloo, fp32, torch's AdamW)
on the answer tokens only. At the end the held-out agreement is measured (see
:mod:`pipeline.judge_model.agreement`), and the model, its tokenizer and a
manifest are written to the output directory.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import TurnstreamError
from pipeline.judge_model.examples import (
    JudgeExample,
    Kind,
    answer_ids,
    eval_answer,
    shared_prefix,
)
from pipeline.judge_model.options import TuneOptions
from pipeline.judge_model.progress import Progress
from pipeline.judge_model.stack import Split, answer_logits, frozen_states

Log = Callable[[str], None]


@dataclass
class KindData:
    """One prompt kind's examples with their frozen states, ready to train or measure."""

    kind: Kind
    prefix_len: int
    prefix_state: torch.Tensor
    examples: list[JudgeExample]
    states: list[torch.Tensor]

    def positions(self, i: int) -> list[int]:
        """Suffix positions whose next token is an answer token."""
        ex = self.examples[i]
        first = len(ex.prompt_ids) - self.prefix_len - 1
        return list(range(first, first + len(ex.answer_ids)))


def prepare(
    split: Split,
    examples: Sequence[JudgeExample],
    prefix_len: int,
    pad_id: int,
    progress: Progress,
) -> KindData:
    """Frozen states of examples of one kind sharing their first ``prefix_len`` tokens."""
    kind = examples[0].kind
    prefix = examples[0].prompt_ids[:prefix_len]
    suffixes = [(e.prompt_ids + e.answer_ids)[prefix_len:-1] for e in examples]
    prefix_state, states = frozen_states(split, prefix, suffixes, pad_id, on_batch=progress.advance)
    return KindData(kind, prefix_len, prefix_state, list(examples), states)


def prefix_lengths(examples: Sequence[JudgeExample]) -> dict[Kind, int]:
    """Per kind, the tokens every prompt of that kind shares (at least one token each keeps)."""
    out: dict[Kind, int] = {}
    for kind in ("eval", "hint"):
        prompts = [e.prompt_ids for e in examples if e.kind == kind]
        if prompts:
            out[kind] = min(shared_prefix(prompts), min(len(p) for p in prompts) - 1)
    return out


def batch_loss(engine: Any, data: KindData, rows: Sequence[int]) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens of ``rows``."""
    positions = [data.positions(i) for i in rows]
    logits = engine(data.prefix_state, [data.states[i] for i in rows], positions)
    targets = torch.tensor([t for i in rows for t in data.examples[i].answer_ids])
    return torch.nn.functional.cross_entropy(logits.float(), targets)


class JudgeHead(torch.nn.Module):
    """The trained layers, norm and output head as one module for DeepSpeed."""

    def __init__(self, split: Split) -> None:
        super().__init__()
        self.model = split.model
        self.split = split

    def forward(
        self, prefix_state: torch.Tensor, states: list[torch.Tensor], positions: list[list[int]]
    ) -> torch.Tensor:
        return answer_logits(self.split, prefix_state, states, positions)


def schedule(data: dict[Kind, KindData], options: TuneOptions) -> list[tuple[Kind, list[int]]]:
    """Every epoch's batches, one kind per batch, in a seeded random order."""
    rng = random.Random(options.seed)
    steps: list[tuple[Kind, list[int]]] = []
    for _ in range(options.epochs):
        epoch: list[tuple[Kind, list[int]]] = []
        for kind, kd in data.items():
            order = list(range(len(kd.examples)))
            rng.shuffle(order)
            size = options.batch_size
            epoch += [(kind, order[at : at + size]) for at in range(0, len(order), size)]
        rng.shuffle(epoch)
        steps += epoch
    return steps


def train(split: Split, data: dict[Kind, KindData], options: TuneOptions, log: Log) -> list[float]:
    """Train the top layers through DeepSpeed; the loss of every step."""
    import deepspeed

    from pipeline.training.engine import setup_distributed

    setup_distributed()
    config = {
        "train_micro_batch_size_per_gpu": options.batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": options.lr, "weight_decay": 0.0, "torch_adam": True},
        },
        "zero_optimization": {"stage": 0},
        "steps_per_print": 10**9,
    }
    head = JudgeHead(split)
    engine, *_ = deepspeed.initialize(model=head, model_parameters=split.trainable(), config=config)
    steps = schedule(data, options)
    losses: list[float] = []
    progress = Progress("training", len(steps), log)
    for kind, rows in steps:
        loss = batch_loss(engine, data[kind], rows)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        progress.advance(1, f"loss {sum(losses[-10:]) / len(losses[-10:]):.3f}")
    progress.done()
    split.model.requires_grad_(False)
    return losses


def decision_tokens(tokenizer: Any, labels: Sequence[int]) -> tuple[int, dict[int, int]]:
    """Where the answers for ``labels`` first differ (a token index), and each one's token
    there: the token that decides the label."""
    answers = {label: answer_ids(tokenizer, eval_answer(label)) for label in labels}
    first = next(iter(answers.values()))
    at = 0
    while all(len(a) > at and a[at] == first[at] for a in answers.values()):
        at += 1
    tokens = {label: a[at] for label, a in answers.items()}
    if len(set(tokens.values())) != len(tokens):
        raise TurnstreamError(f"the answers for {list(labels)} share their deciding token")
    return at, tokens


@torch.no_grad()
def decisions(split: Split, data: KindData, tokenizer: Any, batch: int = 16) -> list[int]:
    """Each example's label by forced choice at its deciding token: the most likely of the
    labels its kind allows (eval: 1, 0, -1; hint: 1, -1)."""
    offset, tokens = decision_tokens(tokenizer, [1, 0, -1] if data.kind == "eval" else [1, -1])
    out: list[int] = []
    for at in range(0, len(data.examples), batch):
        rows = list(range(at, min(at + batch, len(data.examples))))
        positions = [[data.positions(i)[offset]] for i in rows]
        logits = answer_logits(split, data.prefix_state, [data.states[i] for i in rows], positions)
        for row in logits:
            out.append(max(tokens, key=lambda label: float(row[tokens[label]])))
    return out


def elapsed(started: float) -> float:
    return round(time.monotonic() - started, 1)


def data_files(*paths: Path | None) -> list[Path]:
    return [p for p in paths if p is not None]
