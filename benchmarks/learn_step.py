"""Seconds per live-learning step: whole pushes and whole checkpoints vs deltas.

Runs `turnstream learn`'s loop (the real SmolLM2-135M-Instruct, rules judge,
the same seed, users, batch and step count) twice, or more with ``--repeat``,
alternating: **before** (``weight_push: full`` and ``checkpoint_frozen: true``:
every step writes and loads all the weights and checkpoints them all;
every training pass runs the whole model, and no KL to the initial policy
is measured) and **after** (the defaults: the servers get the trained tensors
only after one whole push, checkpoints hold the trained tensors and the
optimizer, the training pass runs the top layers on the frozen layers' output
kept from the pass before the update, the KL sentinel is measured). No
control run, a short held-out evaluation only before and after. The table
splits a step into waiting for its batch (serving and judging), training,
push and checkpoint, from the trainer's metrics rows; it prints the ratio of
seconds per step, after / before. Writes benchmarks/results/learn_step.json.

    python benchmarks/learn_step.py [--steps 8] [--repeat 1] [--eval-prompts 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from common import write_result
from rich.console import Console

from pipeline.learn.options import LearnOptions
from pipeline.learn.run import run_learn
from pipeline.settings import load_settings

LAYOUTS: dict[str, dict[str, Any]] = {
    "before": {
        "weight_push": "full",
        "checkpoint_frozen": True,
        "train_from_frozen_states": False,
        "monitor_kl": False,  # the trainer had no reference then
    },
    "after": {},  # the defaults of `turnstream learn`
}


def one_run(layout: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    options = dataclasses.replace(
        LearnOptions(),
        workdir=root / layout,
        steps=args.steps,
        control=False,
        eval_every=0,
        eval_prompts=args.eval_prompts,
        trainer_extra=LAYOUTS[layout],
        judge="rules",
    )
    report = run_learn(load_settings(), options, Console(quiet=True))
    split = report.training["step_time"]
    return {"layout": layout, "wall_s": round(report.wall_time_s, 1), **split}


def table(rows: list[dict[str, Any]]) -> None:
    print(f"{'layout':8} {'step s':>7} {'wait':>6} {'train':>6} {'push':>6} {'ckpt':>6}  pushes")
    for r in rows:
        m = r["mean_s"]
        pushes = ", ".join(
            f"{p['count']} {kind} ({(p['mean_bytes'] or 0) / 1e6:.0f} MB)"
            for kind, p in r["pushes"].items()
            if p["count"]
        )
        print(f"{r['layout']:8} {r['step_s']:7.2f} {m['wait']:6.2f} {m['train']:6.2f} "
              f"{m['push']:6.2f} {m['checkpoint']:6.2f}  {pushes}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="alternated pairs of runs")
    parser.add_argument("--eval-prompts", type=int, default=8)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="learn-step-") as tmp:
        for _ in range(args.repeat):
            for layout in LAYOUTS:
                rows.append(one_run(layout, args, Path(tmp)))
                print(f"{layout}: {rows[-1]['step_s']} s a step", flush=True)
    table(rows)

    def mean_step(layout: str) -> float:
        steps = [r["step_s"] for r in rows if r["layout"] == layout]
        return sum(steps) / len(steps)

    ratio = mean_step("after") / mean_step("before")
    print(f"seconds per step, after / before: {ratio:.3f} (goal <= 0.6)")
    write_result("learn_step", {"steps": args.steps, "runs": rows, "after_over_before": ratio})


if __name__ == "__main__":
    main()
