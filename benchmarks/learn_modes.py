"""RL, OPD and combine in the live loop, side by side, as OpenClaw-RL's table: held-out
success and accuracy after 8 and 16 steps (theirs, held-out score: binary RL 0.25 / 0.23,
OPD 0.25 / 0.72, combine 0.76 / 0.81).

Each mode is one `turnstream learn` run (``run_learn`` in this process, all on one broker)
with the same seed, users, prompts and step count: SmolLM2-135M-Instruct served on CPU,
judged by the embedded LLM judge (``--judge``), the trainer pushing every step. In opd and
combine the teacher is the served policy, asked with the judge's hint appended to the
prompt. Each run evaluates the held-out prompts at version 0, at the middle step
(``eval_every`` = steps / 2: step 8 of 16) and at the last.

The control is the policy with learning off, which is version 0 at every step: its row is
the version-0 evaluations of the three runs pooled (the same weights, prompts and
evaluation), not a run of its own. The learn run's control phase serves those same initial
weights again and evaluates them the same way: a run's worth of users to measure the same
distribution, where the pooled figure is free and has three times the answers. Its wall
time is the mean time of those evaluations.

Prints the table (mode, success and accuracy at the middle and the last step, mean words at
the last, wall s) and the goal (combine >= rl in held-out success at step 8, OpenClaw-RL's
first column; the middle step when 8 was not evaluated);
writes benchmarks/results/learn_modes.json, rows keyed rl, opd, combine and control, each
with its runs (one per seed). The full default run takes about an hour on 2 cores.

    python benchmarks/learn_modes.py [--steps 16] [--seeds 1] [--judge embedded|rules|URL]
        [--users 16] [--batch-size 16] [--eval-prompts N] [--w-opd W] [--modes rl,combine]
        [--name learn_modes] [--workdir DIR]

``--modes`` runs some of the modes (the goal is checked when rl and combine both ran);
``--name`` writes results/NAME.json instead (a partial run keeps the full table's file).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from common import broker, write_result
from rich.console import Console

from pipeline.errors import TurnstreamError
from pipeline.learn.options import LearnOptions
from pipeline.learn.run import run_learn
from pipeline.settings import Settings

MODES = ("rl", "opd", "combine")
PER_RUN = ("workdir", "mode", "seed", "baseline", "teacher", "teacher_top_k", "w_opd")  # per run
OPENCLAW = {"rl": (0.25, 0.23), "opd": (0.25, 0.72), "combine": (0.76, 0.81)}  # at 8, 16 steps
GOAL_STEP = 8  # combine >= rl in held-out success after 8 steps


def eval_steps(steps: int) -> list[int]:
    """The steps evaluated besides version 0: the middle one (when there is one) and the last."""
    return [steps // 2, steps] if steps // 2 else [steps]


def run_once(settings: Settings, options: LearnOptions, console: Console) -> dict[str, Any]:
    """One learn run's figures at each evaluated step, its version 0's, time and teacher."""
    try:
        report = run_learn(settings, options, console)
    except TurnstreamError as exc:  # recorded in its row; the other runs go on
        console.print(f"[red]{options.mode} seed {options.seed} failed:[/] {exc}")
        return {"seed": options.seed, "error": str(exc)}
    evaluation = report.evaluation
    at = {str(s): evaluation.get("periodic", {}).get(str(s)) for s in eval_steps(options.steps)}
    at[str(options.steps)] = evaluation.get("after")
    return {
        "seed": options.seed,
        "baseline": options.step_baseline,
        "w_opd": options.w_opd,
        "at": at,
        "version0": evaluation.get("before"),
        "version0_s": report.phases_s.get("eval_before"),
        "wall_s": round(report.wall_time_s, 1),
        "teacher": report.training.get("teacher"),
        "samples_trained": report.training.get("samples_trained"),
        "verdict": report.verdict.get("verdict"),
    }


def pooled(evaluations: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Success, accuracy and mean words over the answers of several evaluations."""
    done = [e for e in evaluations if e and e.get("n")]
    n = sum(e["n"] for e in done)
    if not n:
        return None
    return {
        "n": n,
        **{k: round(sum(e[k] * e["n"] for e in done) / n, 4)
           for k in ("success", "accuracy", "mean_words")},
    }  # fmt: skip


def mode_row(runs: list[dict[str, Any]], steps: list[int]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    walls = [r["wall_s"] for r in ok]
    return {
        "at": {str(s): pooled([r["at"].get(str(s)) for r in ok]) for s in steps},
        "wall_s": round(sum(walls) / len(walls), 1) if walls else None,
        "runs": runs,
    }


def control_row(rows: dict[str, dict[str, Any]], steps: list[int]) -> dict[str, Any]:
    """Learning off is version 0 at every step: the runs' version-0 evaluations, pooled."""
    runs = [r for row in rows.values() for r in row["runs"] if "error" not in r]
    version0 = pooled([r["version0"] for r in runs])
    times = [r["version0_s"] for r in runs if r.get("version0_s") is not None]
    return {
        "at": {str(s): version0 for s in steps},
        "wall_s": round(sum(times) / len(times), 1) if times else None,
        "source": "the version-0 evaluations of the learning runs, pooled",
    }


def table(rows: dict[str, dict[str, Any]], steps: list[int]) -> str:
    heads = ["mode"]
    for s in steps:
        heads += [f"success@{s}", f"accuracy@{s}"]
    heads += ["mean words", "wall s"]
    lines = [" | ".join(heads), " | ".join("---" for _ in heads)]
    for mode, row in rows.items():
        cells = [mode]
        for s in steps:
            e = row["at"].get(str(s))
            cells += [f"{e['success']:.3f}", f"{e['accuracy']:.3f}"] if e else ["-", "-"]
        last = row["at"].get(str(steps[-1]))
        cells += [f"{last['mean_words']:.1f}" if last else "-", str(row["wall_s"] or "-")]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def goal(rows: dict[str, dict[str, Any]], step: int) -> dict[str, Any]:
    if "combine" not in rows or "rl" not in rows:
        return {"what": "combine >= rl needs both modes run", "met": None}
    combine, rl = rows["combine"]["at"].get(str(step)), rows["rl"]["at"].get(str(step))
    met = bool(combine and rl and combine["success"] >= rl["success"])
    return {"what": f"combine >= rl in held-out success at step {step}", "met": met}


def modes_arg(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: give some of {', '.join(MODES)}")
    return modes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=16, help="trainer steps of each run")
    parser.add_argument("--seeds", type=int, default=1, help="runs per mode, seeds 0..N-1")
    parser.add_argument("--judge", default="embedded", help="embedded, rules or a judge URL")
    parser.add_argument("--users", type=int, default=LearnOptions.users)
    parser.add_argument("--batch-size", type=int, default=LearnOptions.batch_size)
    parser.add_argument("--micro-batch-size", type=int, default=LearnOptions.micro_batch_size)
    parser.add_argument("--max-tokens", type=int, default=LearnOptions.max_tokens)
    parser.add_argument("--eval-prompts", type=int, default=None, help="default: all held out")
    parser.add_argument(
        "--teacher", default=LearnOptions.teacher, help="opd and combine: initial or policy"
    )
    parser.add_argument("--teacher-top-k", type=int, default=0, help="opd and combine runs")
    parser.add_argument(
        "--w-opd", type=float, default=LearnOptions.w_opd, help="combine: the teacher's weight"
    )
    parser.add_argument(
        "--modes", type=modes_arg, default=MODES, help="comma-separated, of rl, opd, combine"
    )
    parser.add_argument("--name", default="learn_modes", help="results/NAME.json")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per run, seconds")
    parser.add_argument("--workdir", type=Path, default=None, help="keep each run's logs here")
    return parser.parse_args()


def base_options(args: argparse.Namespace, workdir: Path) -> LearnOptions:
    """What every run shares: users, steps, evaluation, judge; learning's own control off."""
    half = args.steps // 2
    return LearnOptions(
        workdir=workdir, users=args.users, steps=args.steps, batch_size=args.batch_size,
        micro_batch_size=min(args.micro_batch_size, args.batch_size),
        max_ahead=args.batch_size, max_tokens=args.max_tokens, eval_prompts=args.eval_prompts,
        eval_every=half, control=False, teacher=args.teacher,
        judge=None if args.judge == "rules" else args.judge,
        timeout_s=args.timeout,
    )  # fmt: skip


def main() -> None:
    args = parse_args()
    console = Console(stderr=True)
    steps = eval_steps(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        base = base_options(args, root)
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in args.modes}
        with broker(Path(tmp)) as settings:
            for seed in range(args.seeds):
                for mode in args.modes:
                    options = dataclasses.replace(
                        base, mode=mode, seed=seed, workdir=root / f"{mode}-seed{seed}",
                        teacher_top_k=0 if mode == "rl" else args.teacher_top_k,
                        w_opd=args.w_opd if mode == "combine" else 1.0,
                    )  # fmt: skip
                    runs[mode].append(run_once(settings, options, console))
    rows = {mode: mode_row(runs[mode], steps) for mode in args.modes}
    rows["control"] = control_row(rows, steps)
    print(table(rows, steps))
    result = {
        "steps": args.steps, "eval_steps": steps, "seeds": args.seeds, "judge": args.judge,
        "options": {k: v for k, v in base.to_json().items() if k not in PER_RUN},
        "w_opd": args.w_opd,
        "rows": rows, "goal": goal(rows, GOAL_STEP if GOAL_STEP in steps else steps[0]),
        "openclaw_rl": {m: dict(zip(("8", "16"), v, strict=True)) for m, v in OPENCLAW.items()},
    }  # fmt: skip
    met = {True: "met", False: "missed", None: "not checked"}[result["goal"]["met"]]
    print(f"goal: {result['goal']['what']}: {met}")
    write_result(args.name, result)


if __name__ == "__main__":
    main()
