"""The trainer's step on the real policy and learn's batches: this tree beside an earlier
commit, side by side.

SmolLM2-135M-Instruct with `turnstream learn`'s trainer settings (the top 8 of 30 layers
trained, micro-batches of 8, Adam at 5e-4, the KL to the initial policy measured): 16
samples a step, prompts in the policy's chat template from the shipped train questions
(every other one a second turn, after a wrong answer and the user's correction, as
learn's sessions go on), responses of 8 to 24 tokens. ``--before REF`` is checked out in a
temporary git worktree; each round runs one process of each tree (load, a warm-up step,
then ``--steps`` timed steps), the two alternating, so a change in the machine's load
falls on both alike. Each side's figure is the median of its timed steps.

    python benchmarks/train_step.py --before REF [--rounds 3] [--steps 3]

Prints a table and writes benchmarks/results/train_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import write_result

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "examples" / "prompts.jsonl"


def workload(tokenizer: Any, n: int, seed: int = 0) -> list[Any]:
    """``n`` samples: a train question in the chat template (every other one a second turn
    after a wrong answer and a correction), then 8-24 response tokens."""
    from pipeline.training.batch import TokenizedSample
    from pipeline.turn_tokens import prompt_token_ids

    rng = random.Random(seed)
    questions = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    questions = [q for q in questions if q["split"] == "train"]
    out = []
    for i in range(n):
        q = rng.choice(questions)
        messages = [{"role": "user", "content": q["prompt"]}]
        if i % 2:
            messages += [
                {"role": "assistant", "content": "I am not sure, but I think it is something."},
                {"role": "user", "content": f"No, that's wrong: it's {q['answer']}."},
            ]
        prompt = list(prompt_token_ids(tokenizer, messages, None, None))
        response = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(8, 24))]
        reward = rng.choice([1.0, -1.0])
        out.append(TokenizedSample(f"t:{i}", prompt, response, reward, None, None, 0))
    return out


def time_steps(steps: int, samples: int) -> dict[str, Any]:
    """In this process, with the ``pipeline`` on sys.path: a warm-up step, then ``steps``
    timed ones."""
    from transformers import AutoTokenizer

    from pipeline.models.fetch import resolve_model
    from pipeline.training.batch import micro_batches
    from pipeline.training.config import TrainerConfig
    from pipeline.training.engine import PolicyEngine

    model = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
    config = TrainerConfig(
        model_path=str(model), lr=5e-4, micro_batch_size=8, train_top_layers=8,
        weight_decay=0.0, max_seq_len=512, update_weights_interval=0,
    )  # fmt: skip
    batch = workload(tokenizer, samples)
    mbs = micro_batches(batch, config.micro_batch_size, pad_id=tokenizer.pad_token_id or 0)
    engine = PolicyEngine(config, len(tokenizer))
    engine.train_step(mbs)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        engine.train_step(mbs)
        times.append(time.perf_counter() - started)
    return {"step_s": times, "tokens": sum(mb.tokens for mb in mbs), **positions(mbs)}


def positions(mbs: list[Any]) -> dict[str, int]:
    """The log-prob positions of the micro-batches, and those from each one's first response
    position on (where the output head runs since it stopped running over the prompt)."""
    total = from_response = 0
    for mb in mbs:
        rows, width = mb.response_mask.shape
        # MicroBatch.response_from, computed here: the earlier tree's MicroBatch has none
        first = int(mb.response_mask.sum(0).nonzero()[0])
        total += rows * width
        from_response += rows * (width - first)
    return {"positions": total, "positions_from_response": from_response}


def run_side(tree: Path, steps: int, samples: int) -> dict[str, Any]:
    """One process timing steps with ``tree``'s pipeline."""
    env = {**os.environ, "PYTHONPATH": str(tree), "DS_ACCELERATOR": "cpu"}
    args = [sys.executable, __file__, "--worker", "--steps", str(steps), "--samples", str(samples)]
    done = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the step timing in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git ref to time beside this tree")
    parser.add_argument("--rounds", type=int, default=3, help="processes per side")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per process")
    parser.add_argument("--samples", type=int, default=16, help="samples per step")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(time_steps(args.steps, args.samples)))
        return
    if not args.before:
        parser.error("--before REF: the commit to compare with")
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                        args.before], check=True, capture_output=True)  # fmt: skip
        try:
            sides: dict[str, list[float]] = {args.before: [], "this tree": []}
            shape: dict[str, Any] = {}
            for n in range(args.rounds):
                for side, tree in ((args.before, before), ("this tree", ROOT)):
                    shape = run_side(tree, args.steps, args.samples)
                    sides[side] += shape.pop("step_s")
                    print(f"round {n + 1}/{args.rounds}: {side} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], check=False)  # fmt: skip
    medians = {side: statistics.median(t) for side, t in sides.items()}
    ratio = medians["this tree"] / medians[args.before]
    print("tree | step s (median) | min | max")
    print("--- | --- | --- | ---")
    for side, t in sides.items():
        print(f"{side} | {medians[side]:.3f} | {min(t):.3f} | {max(t):.3f}")
    print(f"this tree / {args.before}: {ratio:.3f}")
    print(
        f"{shape['tokens']} response tokens; {shape['positions']} log-prob positions, "
        f"{shape['positions_from_response']} from each micro-batch's first response position"
    )
    write_result(
        "train_step",
        {
            "model": "smollm2-135m-instruct", "samples": args.samples, "before": args.before,
            "step_s": sides, "median_s": medians, "ratio_this_over_before": round(ratio, 3),
            **shape,
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()
