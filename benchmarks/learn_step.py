"""Seconds per live-learning step: whole pushes and whole checkpoints vs deltas.

Runs `turnstream learn`'s loop (the real SmolLM2-135M-Instruct, rules judge,
the same seed, users, batch and step count) twice, or more with ``--repeat``,
alternating: **before** (``weight_push: full`` and ``checkpoint_frozen: true``:
every step writes and loads all the weights and checkpoints them all;
every training pass runs the whole model, and no KL to the initial policy
is measured) and **after** (the defaults: the servers get the trained tensors
only after one whole push, checkpoints hold the trained tensors and the
optimizer, the training pass runs the top layers on the frozen layers' output
kept from the pass before the update, the KL sentinel is measured), and
**overlap** (after, with the users a batch further ahead: the next batch is
served while the trainer trains, by the version before). No
control run, a short held-out evaluation only before and after. The table
splits a step into waiting for its batch (serving and judging), training,
push and checkpoint, from the trainer's metrics rows; it prints the ratio of
seconds per step, after / before. Writes benchmarks/results/learn_step.json.

    python benchmarks/learn_step.py [--steps 8] [--repeat 1] [--eval-prompts 8] [--layouts ...]
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
    "overlap": {},  # the defaults, and the users one batch further ahead (LEARN_OPTIONS)
}
# What a layout changes in learn's own options: "overlap" lets the users start the next
# batch's sessions while the trainer trains on this one (served by the version before it,
# one version stale), so serving overlaps training instead of waiting for its push.
LEARN_OPTIONS: dict[str, dict[str, Any]] = {"overlap": {"max_ahead": 2 * LearnOptions.batch_size}}


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
        **LEARN_OPTIONS.get(layout, {}),
    )
    report = run_learn(load_settings(), options, Console(quiet=True))
    split = report.training["step_time"]
    after = report.evaluation.get("after", {})
    return {
        "layout": layout,
        "wall_s": round(report.wall_time_s, 1),
        **split,
        "staleness": report.freshness.get("staleness"),
        "heldout_after": {k: after.get(k) for k in ("success", "accuracy", "mean_words")},
    }


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
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="learn-step-") as tmp:
        for _ in range(args.repeat):
            for layout in args.layouts:
                rows.append(one_run(layout, args, Path(tmp)))
                print(f"{layout}: {rows[-1]['step_s']} s a step", flush=True)
    table(rows)

    def mean_step(layout: str) -> float:
        steps = [r["step_s"] for r in rows if r["layout"] == layout]
        return sum(steps) / len(steps)

    ratios = {
        f"{layout}_over_before": round(mean_step(layout) / mean_step("before"), 3)
        for layout in args.layouts
        if layout != "before" and "before" in args.layouts
    }
    for name, ratio in ratios.items():
        print(f"seconds per step, {name.replace('_over_', ' / ')}: {ratio:.3f} (goal <= 0.6)")
    write_result("learn_step", {"steps": args.steps, "runs": rows, **ratios})


if __name__ == "__main__":
    main()
