"""One training step of `turnstream judge train`: suffixes padded to a batch against packed.

A step runs the trained top layers over the shared prefix, then over the batch's
suffixes (the part of each prompt after the system prompt, and its answer). Padded,
each suffix is filled up to the batch's longest; packed (what `judge train` does),
the suffixes are joined into one row with a mask that keeps them apart, so no
position is computed for nothing. Both give the same logits (tests/unit/
test_judge_stack.py); this measures the forward and backward time of real batches
of the shipped training data on SmolLM2-135M-Instruct, top 4 layers, batch 8.
Prints a table and writes benchmarks/results/judge_step.json.

    python benchmarks/judge_step.py [--batches 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from common import write_result

from pipeline.judge_model.build import DEFAULT_BASE, _load, default_data
from pipeline.judge_model.examples import build_examples
from pipeline.judge_model.progress import Progress
from pipeline.judge_model.stack import PrefixKV, Split, answer_logits, run_layers
from pipeline.judge_model.tune import KindData, prefix_lengths, prepare
from pipeline.models.fetch import ensure_model
from pipeline.rewards.agreement import load_gold
from pipeline.settings import ModelSettings

Logits = Callable[
    [Split, torch.Tensor, Sequence[torch.Tensor], Sequence[Sequence[int]]], torch.Tensor
]


def padded_logits(
    split: Split,
    prefix_state: torch.Tensor,
    suffix_states: Sequence[torch.Tensor],
    positions: Sequence[Sequence[int]],
) -> torch.Tensor:
    """The suffixes as a padded batch [B, longest, D] (the layout before packing)."""
    kv = PrefixKV()
    run_layers(split.model, split.trained, prefix_state, 0, kv)
    kv.recording = False
    width = max(s.shape[0] for s in suffix_states)
    hidden = prefix_state.new_zeros(len(suffix_states), width, prefix_state.shape[-1])
    for row, state in enumerate(suffix_states):
        hidden[row, : state.shape[0]] = state
    out = run_layers(split.model, split.trained, hidden, prefix_state.shape[1], kv)
    rows = torch.tensor([r for r, pos in enumerate(positions) for _ in pos])
    cols = torch.tensor([c for pos in positions for c in pos])
    return split.model.lm_head(split.model.model.norm(out[rows, cols]))


def step_s(split: Split, data: KindData, rows: list[int], logits: Logits) -> float:
    """Seconds of one forward and backward pass over ``rows`` (the gradients are dropped)."""
    started = time.perf_counter()
    positions = [data.positions(i) for i in rows]
    out = logits(split, data.prefix_state, [data.states[i] for i in rows], positions)
    targets = torch.tensor([t for i in rows for t in data.examples[i].answer_ids])
    torch.nn.functional.cross_entropy(out.float(), targets).backward()
    took = time.perf_counter() - started
    split.model.zero_grad(set_to_none=True)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=12, help="batches of 8 timed")
    parser.add_argument("--repeats", type=int, default=3, help="passes over those batches")
    args = parser.parse_args()
    tokenizer, model = _load(ensure_model(DEFAULT_BASE, ModelSettings()))
    split = Split(model, 4)
    split.trainable()
    train_file: Path = default_data()[0]
    examples = [e for e in build_examples(load_gold(train_file), tokenizer) if e.kind == "eval"]
    rng = random.Random(0)
    chosen = rng.sample(examples, 8 * args.batches)
    prefix = prefix_lengths(examples)["eval"]
    data = prepare(
        split,
        chosen,
        prefix,
        int(tokenizer.pad_token_id or 0),
        Progress("frozen layers", len(chosen), lambda _line: None),
    )
    batches = [list(range(at, at + 8)) for at in range(0, len(chosen), 8)]
    layouts: dict[str, Logits] = {"padded": padded_logits, "packed": answer_logits}
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(args.repeats):
        for name, logits in layouts.items():  # alternated, so drift touches both alike
            times[name].append(sum(step_s(split, data, rows, logits) for rows in batches))
    lengths = [s.shape[0] for s in data.states]
    padded_tokens = sum(max(lengths[i] for i in rows) * len(rows) for rows in batches)
    rows_out = {
        name: {
            "step_s_median": round(statistics.median(t) / len(batches), 3),
            "step_s_min": round(min(t) / len(batches), 3),
            "suffix_tokens": padded_tokens if name == "padded" else sum(lengths),
        }
        for name, t in times.items()
    }
    ratio = rows_out["packed"]["step_s_median"] / rows_out["padded"]["step_s_median"]
    print(f"{'layout':<8} {'step s (median)':>16} {'step s (min)':>13} {'suffix tokens':>14}")
    for name, row in rows_out.items():
        print(
            f"{name:<8} {row['step_s_median']:>16} {row['step_s_min']:>13} "
            f"{row['suffix_tokens']:>14}"
        )
    print(f"packed / padded step time: {ratio:.3f} (prefix {prefix} tokens, batch 8)")
    write_result(
        "judge_step",
        {"batches": args.batches, "repeats": args.repeats, "prefix_tokens": prefix,
         "layouts": rows_out, "packed_over_padded": round(ratio, 3)},
    )  # fmt: skip


if __name__ == "__main__":
    main()
