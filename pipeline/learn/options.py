"""The options of a live run, with the settings that make a 135M model learn on 2 CPU cores."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.learn.preference import RightAndShort
from pipeline.learn.users import Sampling

MODES = ("rl", "opd", "combine")
LR_SCHEDULES = ("constant", "cosine")
# opd/combine: whose log-probs teach. initial: the policy's weights before learning, hinted,
# on a server of its own (a fixed target, as OpenClaw-RL's PRM server, which no push
# reaches); policy: the served policy itself, hinted (it moves with every push)
TEACHERS = ("initial", "policy")
# --teacher-top-k K: the trainer's weight of the reverse KL to the teacher's top-K tokens
# (beside the sampled token's teacher - old advantage), as OpenClaw-RL's top-K variant adds it
TOPK_DISTILL_COEF = 1.0
# opd/combine: teacher - old limited to [-1, 1] nats a token, the scale of the judge's reward:
# unlimited, a hinted 135M teacher's gap of up to 12 nats on one token drove entropy from 2.2
# to 3.5 in 7 steps (answers ran to the token limit)
TEACHER_ADV_CLIP = 1.0
# ... and relative to its mean (teacher_baseline mean): with the clip alone, entropy still
# rose 2.5 -> 3.2 in 8 steps and held-out accuracy fell 0.183 -> 0.140
TEACHER_BASELINE = "mean"
# a step whose 16 answers the users all rejected updates nothing (the trainer's alike_steps
# skip): no weight and no Adam moment moves. Centred on their mean (no_signal) the -1s were
# 0 and Adam's momentum alone carried a run whose answers had collapsed to empty ones (make
# demo, once in eight runs; KL to the initial policy 1.25 -> 6 -> 16 nats); kept as -1s
# (raw) they pushed down every token sampled, and a run whose first 19 steps were all
# rejected ran to the token limit (accuracy 0.204 -> 0.118 by version 16)
ALIKE_STEPS = "skip"


@dataclass(frozen=True)
class LearnOptions:
    model: str = "smollm2-135m-instruct"  # a catalogued name or a HF checkpoint directory
    prompts: Path | None = None  # default: the shipped examples/prompts.jsonl
    workdir: Path = Path(".turnstream/learn")
    users: int = 16
    temperature: float = 1.0
    max_tokens: int = 24
    max_words: int = 15
    # trainer optimizer steps (one weight push each). 32: three runs (seeds 2, 1 and 0, each
    # with its control) ended +0.301, +0.387 and +0.333 in held-out success over their
    # controls, where runs of 16 steps ended +0.183 to +0.269; the demo keeps 16 (DEMO_STEPS)
    steps: int = 32
    batch_size: int = 16
    micro_batch_size: int = 8
    # Adam's rate, along the cosine below. 2.5e-4: three demo-length runs (eval at 8 and 16)
    # ended at held-out success 0.312, 0.290 and 0.312, accuracy 0.10 to 0.17 above version
    # 0's; at 5e-4, of three demos one collapsed to empty answers, one drifted back (accuracy
    # 0.290 -> 0.161) and one ended 0.043 above version 0
    lr: float = 2.5e-4
    # the trainer's kl_coef: the weight of the KL to the initial policy in the loss (k3 on the
    # sampled tokens). Off: at 0.1 it pulled answers back toward the initial policy's length
    # and did not keep the early gains (held-out success 0.323 at v4, 0.280 at v16)
    kl_coef: float = 0.0
    # the trainer's lr_schedule (constant, or cosine down to 0.1 x lr at the last step) and
    # lr_warmup_steps. cosine: held-out success 0.366 and 0.344 after 16 steps in two runs
    # (monotone but for one dip), against 0.333 and 0.280 at a constant lr, which peaked at
    # version 4 and fell back
    lr_schedule: str = "cosine"
    lr_warmup: int = 0
    # the trainer's entropy_coef: > 0 an entropy bonus, < 0 entropy minimisation (sharpens the
    # policy toward its likeliest answer)
    entropy_coef: float = 0.0
    # rl: the judge's reward; opd: teacher - old per token, the teacher (see TEACHERS) asked
    # with the hint-augmented prompt; combine: both
    mode: str = "rl"
    # the trainer's step_baseline: none, mean, mean_std or leave_one_out; None: mean for rl
    # and combine (whose reward term it centres), none for opd (nothing to centre: see
    # step_baseline)
    baseline: str | None = None
    # sessions started one after another that ask the same prompt (1: each user picks its
    # own); G > 1 centres each reward on the step's other answers to the same question (the
    # trainer's baseline_group prompt, GRPO's group inside one step)
    group_size: int = 1
    teacher: str = "initial"  # opd/combine: one of TEACHERS
    teacher_top_k: int = 0  # opd/combine: top-K teacher log-probs and their distillation
    # opd/combine: train on hinted - neutral (the teacher also asked with a neutral line in
    # the hint's place) instead of hinted - old
    teacher_contrast: bool = False
    # combine: the weight of the teacher term beside the reward's (the trainer's w_opd)
    w_opd: float = 1.0
    train_top_layers: int | None = 8  # the rest of the policy stays frozen: cheap CPU steps
    max_ahead: int | None = 16  # sessions started ahead of the trainer (None: no limit)
    eval_samples: int = 1  # answers per held-out prompt in each evaluation
    eval_prompts: int | None = None  # evaluate the first N held-out prompts (None: all)
    eval_every: int = 4  # also evaluate every Nth version pushed before the last (0: never)
    control: bool = True  # the same loop with learning off, then its evaluation
    control_sessions: int | None = 64  # user sessions of the control (None: as many as learning)
    judge: str | None = "embedded"  # the trained LLM judge; "rules" (or None) or a base URL
    judge_max_tokens: int | None = None  # per vote (None: 256 embedded, else the worker's 4,096)
    seed: int = 0
    server_threads: int | None = None
    console: bool = False  # `turnstream console` on the run's topics, while it runs
    console_port: int | None = None  # its port (None: the console's setting, 8080; 0: any free)
    timeout_s: float = 3600.0  # 32 steps and the control took 914 to 994 s here
    trainer_extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_mode()
        self._check_group()
        if self.console_port is not None and not 0 <= self.console_port <= 65535:
            raise ConfigError(
                f"console_port (--console-port) {self.console_port}: give a port from 1 to "
                "65535, or 0 for any free one"
            )
        if self.eval_every < 0:
            raise ConfigError(
                f"eval_every (--eval-every) is {self.eval_every}: give 0 (no evaluation while "
                "learning) or N > 0 (every Nth version pushed)"
            )
        if self.max_ahead is not None and self.max_ahead < self.batch_size:
            raise ConfigError(
                f"max_ahead {self.max_ahead} is below the batch size {self.batch_size}: the "
                "users would wait for a step that waits for their samples; give at least "
                "the batch size (or no limit)"
            )

    def _check_group(self) -> None:
        if self.group_size < 1 or self.batch_size % self.group_size:
            raise ConfigError(
                f"group_size (--group-size) {self.group_size}: give a divisor of the batch size "
                f"{self.batch_size} (1: each user picks its own prompt)"
            )
        if self.group_size > 1 and self.step_baseline == "none":
            raise ConfigError(
                f"group_size (--group-size) {self.group_size} centres the reward on its group, "
                "and this run has no baseline (mode opd, or --baseline none): give 1, or mode "
                "rl or combine with a baseline"
            )

    def _check_mode(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode (--mode) {self.mode!r}: choose one of {', '.join(MODES)}")
        if self.mode == "opd" and self.baseline not in (None, "none"):
            raise ConfigError(
                f"baseline (--baseline) {self.baseline} with mode opd: a baseline centres the "
                "judge's reward, and opd trains on teacher - old alone; give none, or mode "
                "combine"
            )
        if self.teacher not in TEACHERS:
            raise ConfigError(
                f"teacher (--teacher) {self.teacher!r}: choose initial (the weights before "
                "learning, hinted, on a server of its own) or policy (the served policy, hinted)"
            )
        if self.teacher_contrast and self.mode == "rl":
            raise ConfigError(
                "teacher_contrast (--teacher-contrast) needs mode opd or combine: rl has no teacher"
            )
        if self.lr_schedule not in LR_SCHEDULES or self.lr_warmup < 0:
            raise ConfigError(
                f"lr_schedule (--lr-schedule) {self.lr_schedule!r} / lr_warmup (--lr-warmup) "
                f"{self.lr_warmup}: choose one of {', '.join(LR_SCHEDULES)}, and 0 or more "
                "warm-up steps"
            )
        if not math.isfinite(self.entropy_coef):
            raise ConfigError(
                f"entropy_coef (--entropy-coef) {self.entropy_coef}: give a finite number "
                "(> 0 a bonus for entropy, < 0 a penalty, 0 none)"
            )
        if not self.kl_coef >= 0:
            raise ConfigError(
                f"kl_coef (--kl-coef) {self.kl_coef}: the weight of the KL to the initial "
                "policy in the loss; give a number >= 0 (0: measured, not penalised)"
            )
        if not self.w_opd >= 0 or (self.w_opd != 1.0 and self.mode != "combine"):
            raise ConfigError(
                f"w_opd (--w-opd) {self.w_opd}: the teacher term's weight beside the reward's "
                "applies to mode combine; give a weight >= 0 there (opd trains on the teacher "
                "alone, rl has none)"
            )
        if self.teacher_top_k < 0 or (self.teacher_top_k and self.mode == "rl"):
            raise ConfigError(
                f"teacher_top_k (--teacher-top-k) {self.teacher_top_k}: give K >= 1 with "
                "mode opd or combine (rl has no teacher), or 0"
            )

    @property
    def step_baseline(self) -> str:
        """The trainer's baseline: the one given, else mean for rl and combine (the reward
        term relative to the step's other samples, so combine differs from rl only by its
        teacher term) and none for opd (its advantage, teacher - old per token, is no reward
        to centre; OpenClaw-RL's, and the trainer refuses a baseline with opd)."""
        if self.baseline is not None:
            return self.baseline
        return "none" if self.mode == "opd" else "mean"

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.max_tokens)

    @property
    def preference(self) -> RightAndShort:
        return RightAndShort(self.max_words)

    def trainer_options(self) -> dict[str, Any]:
        """The trainer's config: fresh-weights steps in the run's mode, each pushed to the
        server."""
        topk = {"topk_distill_coef": TOPK_DISTILL_COEF} if self.teacher_top_k else {}
        teacher: dict[str, Any] = {}
        if self.mode != "rl":
            teacher = {"teacher_adv_clip": TEACHER_ADV_CLIP, "teacher_baseline": TEACHER_BASELINE}
        if self.mode == "combine":
            teacher["w_opd"] = self.w_opd
        return {
            "mode": self.mode,
            "rollout_batch_size": self.batch_size,
            "micro_batch_size": self.micro_batch_size,
            "lr": self.lr,
            "kl_coef": self.kl_coef,
            "lr_schedule": self.lr_schedule,
            "lr_warmup_steps": self.lr_warmup,
            "entropy_coef": self.entropy_coef,
            "step_baseline": self.step_baseline,
            "alike_steps": ALIKE_STEPS,
            "baseline_group": "prompt" if self.group_size > 1 else "step",
            **topk,
            **teacher,
            "weight_decay": 0.0,
            "max_steps": self.steps,
            "update_weights_interval": 1,
            "max_seq_len": 512,
            "train_top_layers": self.train_top_layers,
            "checkpoint_frozen": False,  # the frozen layers are the model's: not saved per step
            "seed": self.seed,
            **self.trainer_extra,
        }

    def to_json(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self), "baseline": self.step_baseline}  # the one used
        return {k: str(v) if isinstance(v, Path) else v for k, v in out.items()}


DEMO_STEPS = 16  # the demo's steps: within 10 minutes on 2 cores (7 min 30 s in two runs)


def demo_options(
    workdir: Path, console: bool = True, console_port: int | None = None
) -> LearnOptions:
    """`turnstream demo`: the live loop shortened to DEMO_STEPS, without its control run,
    evaluated at version 8 on the way, with the console (`turnstream learn` is the full,
    measured run)."""
    return dataclasses.replace(
        LearnOptions(),
        workdir=workdir,
        steps=DEMO_STEPS,
        control=False,
        eval_every=8,
        console=console,
        console_port=console_port,
    )
