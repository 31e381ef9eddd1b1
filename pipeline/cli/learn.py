"""`turnstream learn`: the live learning loop with the real model, measured."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from pipeline.learn.options import LearnOptions
from pipeline.learn.report import GOAL_GAIN, HACK_DROP, REWARD_HACKING, LearnReport, eval_gain
from pipeline.settings import load_settings

console = Console(soft_wrap=True)
DEFAULTS = LearnOptions()
BASELINES = ("none", "mean", "mean_std", "leave_one_out")
BASELINE_HELP = (
    "reward baseline of each trainer step: none (the raw score), mean, mean_std or "
    "leave_one_out (each sample's score relative to the rest of its step); default: mean "
    "for rl and combine, none for opd (which has no reward to centre)"
)
MODE_HELP = (
    "rl (the judge's reward), opd (on-policy distillation: teacher - old per token, the "
    "teacher (--teacher) asked with the judge's hint appended; turns without a hint do not "
    "train) or combine (both)"
)
TEACHER_HELP = (
    "opd/combine: initial (the policy's weights before learning, hinted, served on their "
    "own: a fixed target) or policy (the served policy itself, hinted: it moves with "
    "every push)"
)
CONTRAST_HELP = (
    "opd/combine: also ask the teacher with a neutral line in the hint's place and train "
    "on hinted - neutral (the hint's own effect) instead of hinted - old"
)
TEACHER_TOP_K_HELP = (
    "opd/combine: the teacher's top-K log-probs per token, and the trainer's reverse KL to "
    "them (topk_distill_coef 1.0); 0: off"
)
MAX_AHEAD_HELP = (
    "sessions users may start ahead of the trainer (their samples neither trained "
    "nor excluded yet); more wait for its next push (default: the batch size; at least "
    "that; 0: no limit)"
)
JUDGE_HELP = (
    "embedded (default: the trained judge smollm2-135m-judge, an LLM served here, built "
    "once), rules (a regex judge, no model) or the base URL of an OpenAI-compatible judge"
)
JUDGE_MAX_TOKENS_HELP = (
    "tokens one judge vote may generate (default: 256 for the embedded judge, "
    "the scoring worker's 4096 for a URL)"
)
EVAL_EVERY_HELP = (
    "also evaluate every Nth version pushed before the last, users held meanwhile "
    "(0: only version 0, the final version and the control)"
)
W_OPD_HELP = (
    "combine: the weight of the teacher term (teacher - old, per token) beside the reward's "
    "weight of 1"
)
LR_SCHEDULE_HELP = (
    "constant (lr at every step) or cosine (lr falls along a half cosine to 0.1 x lr at "
    "the last step)"
)
ENTROPY_HELP = (
    "the trainer's entropy_coef: > 0 rewards entropy, < 0 penalises it (sharpens the policy "
    "toward its likeliest answer)"
)
KL_COEF_HELP = (
    "weight of the KL to the initial policy in the trainer's loss (k3 on the sampled tokens): "
    "pulls the policy back when every answer of a step scored the same; 0: measured, not "
    "penalised"
)
CONSOLE_HELP = (
    "also serve `turnstream console` on the run's topics while it runs (its URL is printed "
    "first and kept in learn.json; one that fails to start is a warning)"
)
CONSOLE_PORT_HELP = "--console: its port (default: TURNSTREAM_CONSOLE_PORT, 8080; 0: any free)"
CONTROL_SESSIONS_HELP = "user sessions of the control (0: as many as the learning phase had)"
GROUP_SIZE_HELP = (
    "sessions started one after another that ask the same prompt; above 1, each reward is "
    "taken relative to the step's other answers to that prompt (must divide the batch size)"
)
EXIT_REWARD_HACKING = 3  # the run finished, and its held-out accuracy fell: see learn.json


def learn(
    model: str = typer.Option(DEFAULTS.model, help="policy: a model name or a HF directory"),
    users: int = typer.Option(DEFAULTS.users, help="simulated users talking at once"),
    steps: int = typer.Option(DEFAULTS.steps, help="trainer steps (one weight push each)"),
    batch_size: int = typer.Option(DEFAULTS.batch_size, help="samples per trainer step"),
    lr: float = typer.Option(DEFAULTS.lr, help="Adam learning rate"),
    kl_coef: float = typer.Option(DEFAULTS.kl_coef, help=KL_COEF_HELP),
    lr_schedule: str = typer.Option(DEFAULTS.lr_schedule, help=LR_SCHEDULE_HELP),
    lr_warmup: int = typer.Option(DEFAULTS.lr_warmup, help="steps that ramp lr up linearly"),
    entropy_coef: float = typer.Option(DEFAULTS.entropy_coef, help=ENTROPY_HELP),
    mode: str = typer.Option(DEFAULTS.mode, help=MODE_HELP),
    baseline: str = typer.Option(None, help=BASELINE_HELP, show_default=False),
    group_size: int = typer.Option(DEFAULTS.group_size, help=GROUP_SIZE_HELP),
    teacher: str = typer.Option(DEFAULTS.teacher, help=TEACHER_HELP),
    teacher_top_k: int = typer.Option(DEFAULTS.teacher_top_k, help=TEACHER_TOP_K_HELP),
    teacher_contrast: bool = typer.Option(DEFAULTS.teacher_contrast, help=CONTRAST_HELP),
    w_opd: float = typer.Option(DEFAULTS.w_opd, help=W_OPD_HELP),
    max_tokens: int = typer.Option(DEFAULTS.max_tokens, help="answer length limit, tokens"),
    max_words: int = typer.Option(DEFAULTS.max_words, help="the right answer in at most N words"),
    temperature: float = typer.Option(DEFAULTS.temperature, help="sampling, users and evaluation"),
    eval_samples: int = typer.Option(DEFAULTS.eval_samples, help="answers per held-out prompt"),
    eval_prompts: int = typer.Option(None, help="evaluate only the first N held-out prompts"),
    eval_every: int = typer.Option(DEFAULTS.eval_every, help=EVAL_EVERY_HELP),
    control: bool = typer.Option(True, help="also run the loop with learning off (the control)"),
    control_sessions: int = typer.Option(DEFAULTS.control_sessions, help=CONTROL_SESSIONS_HELP),
    train_top_layers: int = typer.Option(
        DEFAULTS.train_top_layers, help="train the top N decoder layers (0: every parameter)"
    ),
    micro_batch_size: int = typer.Option(DEFAULTS.micro_batch_size, help="samples per pass"),
    max_ahead: int = typer.Option(None, help=MAX_AHEAD_HELP, show_default=False),
    judge: str = typer.Option(DEFAULTS.judge, help=JUDGE_HELP),
    judge_max_tokens: int = typer.Option(None, help=JUDGE_MAX_TOKENS_HELP),
    prompts: Path = typer.Option(None, help="prompt set JSONL (default: examples/prompts.jsonl)"),
    workdir: Path = typer.Option(
        DEFAULTS.workdir, help="logs, state, learn.json and learn.png (a fresh trainer each run)"
    ),
    seed: int = typer.Option(DEFAULTS.seed, help="the users' choices of prompts"),
    timeout: float = typer.Option(DEFAULTS.timeout_s, help="give up after this many seconds"),
    with_console: bool = typer.Option(False, "--console", help=CONSOLE_HELP),
    console_port: int = typer.Option(None, help=CONSOLE_PORT_HELP, show_default=False),
) -> None:
    """Close the learning loop here, with the real model, and measure it.

    Starts what is not running (the local broker unless KAFKA_BOOTSTRAP_SERVERS is set),
    then the policy server, the capture proxy, a scoring worker and the trainer, and a
    population of simulated users who want the right answer, briefly (thanks; a
    correction stating the answer; a request to be shorter). It evaluates the held-out
    prompts before and after, runs the control (learning off) and writes learn.json and
    learn.png to the work directory. Ctrl-C stops everything it started.

    Exit status: 0 finished; 3 finished with the verdict "reward hacking" (held-out accuracy
    at the end more than 0.05 below version 0's); 130 interrupted; 1 on an error.
    """
    flags = dict(locals())  # every flag, by its LearnOptions name
    flags["console"] = flags.pop("with_console")
    run_and_report(learn_options(**flags), "run")


def learn_options(
    *,
    baseline: str | None,
    batch_size: int,
    control_sessions: int,
    train_top_layers: int,
    max_ahead: int | None,
    timeout: float,
    **flags: Any,
) -> LearnOptions:
    """`turnstream learn`'s flags as LearnOptions: 0 means none for --control-sessions,
    --train-top-layers and --max-ahead, whose default is the batch size; the other flags
    are the options of the same names (LearnOptions refuses a bad --mode, or a
    --baseline or --teacher-top-k the mode cannot use, with the flag named)."""
    if baseline is not None and baseline not in BASELINES:
        raise typer.BadParameter(
            f"{baseline!r}: choose one of {', '.join(BASELINES)}", param_hint="--baseline"
        )
    return LearnOptions(
        baseline=baseline,
        batch_size=batch_size,
        control_sessions=control_sessions or None,
        train_top_layers=train_top_layers or None,
        max_ahead=batch_size if max_ahead is None else (max_ahead or None),
        timeout_s=timeout,
        **flags,
    )


def run_and_report(options: LearnOptions, what: str) -> None:
    """Run the loop, print its summary; SIGTERM and Ctrl-C stop everything it started."""
    from pipeline.learn.run import run_learn

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    logging.basicConfig(level=logging.WARNING)
    try:
        report = run_learn(load_settings(), options, console)
    except KeyboardInterrupt:
        console.print(f"\ninterrupted: stopped everything this {what} started")
        raise typer.Exit(130) from None
    console.print(summary_table(report))
    j = report.judge
    if j.get("votes") and j["failed_votes"] * 2 > j["votes"]:
        console.print(
            f"[yellow]warning:[/] {j['failed_votes']} of {j['votes']} judge votes gave no "
            "\\boxed{} score: that judge does not follow the judging prompt (a small model "
            "rarely does), so its samples score 0 and teach the policy nothing"
        )
    workdir = options.workdir
    console.print(f"report: {workdir / 'learn.json'}\nchart: {workdir / 'learn.png'}")
    if report.verdict.get("verdict") == REWARD_HACKING:
        change = report.verdict["accuracy_change"]
        console.print(
            f"[bold red]REWARD HACKING:[/] held-out accuracy changed by {change:+.3f} from "
            f"version 0 to the final version (more than {HACK_DROP} lost): the policy learned "
            "to please the users' replies, not to answer better; exit status "
            f"{EXIT_REWARD_HACKING}"
        )
        raise typer.Exit(EXIT_REWARD_HACKING)


def eval_rows(table: Table, evaluation: dict[str, Any]) -> None:
    """The held-out figures of each evaluated version: success, accuracy, words, degenerate."""
    for label in ("before", "after", "control"):
        e = evaluation.get(label)
        if e:
            table.add_row(
                f"held-out {label}: success / accuracy",
                f"{e['success']:.3f} / {e['accuracy']:.3f} (n={e['n']})",
            )
            table.add_row(
                f"held-out {label}: words / degenerate",
                f"{e['mean_words']:.1f} / {e['degenerate']:.3f}",
            )
    for version, e in (evaluation.get("periodic") or {}).items():
        table.add_row(
            f"held-out version {version}: success / accuracy",
            f"{e['success']:.3f} / {e['accuracy']:.3f}, {e['mean_words']:.1f} words, "
            f"degenerate {e['degenerate']:.3f}",
        )


def divergence_rows(table: Table, divergence: list[dict[str, Any]]) -> None:
    """The sentinels' verdict: each evaluation at which the train reward rose while the
    held-out accuracy fell (a warning beside the verdict), or that none did."""
    if not divergence:
        table.add_row("divergence (train reward up, held-out accuracy down)", "none")
    for d in divergence:
        table.add_row(f"[bold red]divergence at version {d['version']}[/]", d["reason"])


def summary_table(report: LearnReport) -> Table:
    table = Table(title=f"learn: {report.preference}")
    table.add_column("what")
    table.add_column("value", justify="right")
    eval_rows(table, report.evaluation)
    gain = eval_gain(report.evaluation)
    if gain is not None:
        table.add_row("final - control (success)", f"{gain:+.3f} (goal +{GOAL_GAIN:.2f})")
    v = report.verdict
    if v.get("verdict"):
        missed = [goal for goal, held in v.get("goals", {}).items() if not held]
        loud = "[bold red]" if v["verdict"] == REWARD_HACKING else ""
        table.add_row(
            "verdict",
            f"{loud}{v['verdict']}" + (f" (missed: {', '.join(missed)})" if missed else ""),
        )
        divergence_rows(table, v.get("divergence", []))
    a = report.alignment
    if a.get("tokens"):
        table.add_row(
            "log-prob |server - trainer| mean / max",
            f"{a['mean_abs_diff']:.2e} / {a['max_abs_diff']:.2e} over {a['tokens']} tokens",
        )
    f = report.freshness
    if f.get("samples"):
        table.add_row("freshness p50 / p95", f"{f['p50_s']}s / {f['p95_s']}s")
        table.add_row("staleness mean / max", f"{f['staleness_mean']} / {f['staleness_max']}")
    j = report.judge
    if j.get("backend"):
        table.add_row("judge", j["backend"])
    if j.get("votes"):
        table.add_row(
            f"judge votes ({j['backend']})",
            f"{j['votes']} over {j['samples_judged']} samples, {j['failed_votes']} without a score",
        )
    agree = j.get("intent_agreement") or {}
    if agree.get("n"):
        kappa = agree["kappa"]
        table.add_row(
            "judge majority vs users' intent",
            f"accuracy {agree['accuracy']:.3f}, kappa "
            f"{'undefined' if kappa is None else f'{kappa:.3f}'} over {agree['n']} replies",
        )
    table.add_row("mode", str(report.options.get("mode", "rl")))
    teacher = report.training.get("teacher") or {}
    if report.options.get("mode", "rl") != "rl" and teacher:
        table.add_row(
            "trained with / without a teacher signal",
            f"{teacher['trained_with_teacher']} / {teacher['trained_without_teacher']} "
            f"({teacher['excluded_no_hint']} dropped: no hint; "
            f"{teacher.get('excluded_hint_rejected', 0)}: every hint flawed)",
        )
    table.add_row("pushes", str(len(report.pushes)))
    table.add_row("samples trained", str(report.training.get("samples_trained", 0)))
    if held := report.training.get("steps_without_update"):
        table.add_row("steps without update (every score alike)", str(held))
    table.add_row("wall time", f"{report.wall_time_s:.0f}s")
    return table
