"""The trainer's options: one dataclass, a help string per field, loaded from YAML."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, ValidationError
from pydantic.dataclasses import dataclass

from pipeline.backoff import RetryPolicy
from pipeline.errors import ConfigError


def opt(default: Any, help: str, **kw: Any) -> Any:
    """A field with its help text (shown by `turnstream train --help-config`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class TrainerConfig:
    # What to train
    mode: Literal["rl", "opd", "combine"] = opt(
        "rl", "advantage: rl reward, opd teacher-old, or combine (both, weighted)"
    )
    model_path: str | None = opt(None, "local HF causal LM directory; unset = tiny random model")
    tokenizer_path: str | None = opt(
        None, "local tokenizer (policy chat template); defaults to model_path"
    )
    tiny_model: dict[str, int] = opt(
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "sizes of the random Qwen2-style model used when model_path is unset",
    )
    seed: int = opt(1234, "seed for model init and batch order")
    # Batching
    rollout_batch_size: int = opt(16, "samples per optimizer step (excluded samples take none)")
    max_tokens_per_batch: int | None = opt(None, "token budget per step instead of a count")
    micro_batch_size: int = opt(4, "samples per forward/backward pass")
    length_bucketing: bool = opt(True, "group samples of similar length into micro-batches")
    max_seq_len: int = opt(4096, "longer samples are truncated from the left of the prompt")
    # Optimizer
    lr: float = opt(1e-5, "Adam learning rate")
    weight_decay: float = opt(0.1, "AdamW weight decay")
    betas: list[float] = opt([0.9, 0.98], "Adam betas")
    grad_clip: float = opt(1.0, "gradient norm clip")
    lr_schedule: Literal["constant", "cosine"] = opt(
        "constant",
        "constant: lr at every step; cosine: lr falls along a half cosine from lr (after the "
        "warm-up) to lr * lr_min_ratio at step max_steps (needs max_steps)",
    )
    lr_warmup_steps: int = opt(
        0, "the first N optimizer steps ramp lr up linearly: step k (1..N) takes lr * k/(N+1)"
    )
    lr_min_ratio: float = opt(0.1, "cosine: the last step's lr as a share of lr")
    # Loss
    eps_clip: float = opt(0.2, "PPO clip below 1")
    eps_clip_high: float = opt(0.28, "PPO clip above 1")
    w_opd: float = opt(1.0, "combine: weight of teacher - old")
    w_rl: float = opt(1.0, "combine: weight of the reward")
    teacher_baseline: Literal["none", "mean"] = opt(
        "none",
        "opd/combine: teacher - old as it is (none, OpenClaw-RL's), or less its mean over "
        "the micro-batch's taught tokens (mean: a baseline; its mean, -KL, otherwise pushes "
        "every sampled token down and flattens the policy)",
    )
    teacher_adv_clip: float | None = opt(
        None,
        "opd/combine: limit teacher - old per token to [-C, C] nats (unset: no limit, as "
        "OpenClaw-RL); a hinted teacher's gap reaches 10 nats on a token, and one such "
        "token outweighs a whole response",
    )
    group_advantage: Literal["none", "mean", "mean_std", "leave_one_out"] = opt(
        "none",
        "grouped samples (group_scores): rl reward relative to their group, as r - mean, "
        "(r - mean) / std (GRPO) or r - mean of the others (RLOO); none = the raw score",
    )
    step_baseline: Literal["none", "mean", "mean_std", "leave_one_out"] = opt(
        "none",
        "rl reward relative to the other samples of the same optimizer step (a baseline for "
        "ungrouped samples, as REINFORCE with a batch baseline): r - mean, (r - mean) / std or "
        "r - mean of the others; none = the raw score (the reference's behaviour)",
    )
    baseline_group: Literal["step", "prompt"] = opt(
        "step",
        "step_baseline: relative to the whole step (step), or to the step's samples that share "
        "its prompt (prompt: GRPO's group inside one step; a prompt the step holds once is "
        "taken relative to the whole step)",
    )
    alike_steps: Literal["no_signal", "raw", "skip"] = opt(
        "no_signal",
        "step_baseline: a step whose samples all scored the same (every answer rejected, "
        "say) has no relative signal; no_signal: every advantage 0 (only Adam's momentum "
        "moves the weights), raw: its scores as they are (a step of -1s pushes its answers "
        "down, away from what every user rejected), skip: in mode rl no update at all (the "
        "weights and Adam's moments stay, the step is measured, counted and pushed, the lr "
        "schedule moves on); in opd and combine the teacher term still trains, as no_signal",
    )
    kl_coef: float = opt(
        0.0,
        "weight of the KL to the initial policy in the loss (0 = no penalty; the KL is still "
        "measured while monitor_kl is on)",
    )
    kl_kind: Literal["k1", "k3"] = opt("k3", "KL estimator")
    monitor_kl: bool = opt(
        True,
        "measure the KL to the initial policy at every step (the kl metric), kl_coef or not: "
        "with train_top_layers from frozen copies of the top layers and the final norm, run on "
        "the policy's own hidden state (about top/N of a forward pass); without, from a full "
        "copy of the model (its memory, and one more forward pass). false with kl_coef 0: no "
        "reference, kl is 0",
    )
    train_from_frozen_states: bool = opt(
        True,
        "with train_top_layers, the training pass runs the top layers only, on the frozen "
        "layers' output kept from the pass before the update (the same numbers, about "
        "top/N of a forward pass); false: the whole model each pass",
    )
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = opt(
        "seq_mean_token_mean",
        "how per-token losses become one: the mean over samples of each one's token mean "
        "(the reference's default: slime's per-sample mean, which OpenClaw-RL's scripts keep), "
        "or token_mean (every token the same weight, so long responses count more)",
    )
    tis_clip: float = opt(
        2.0,
        "C of the behaviour weight min(pi_old/pi_rollout, C) that corrects for the serving "
        "engine's log-probs (once: PPO's ratio is taken to the trainer's own old log-probs)",
    )
    topk_distill_coef: float = opt(
        0.0,
        "opd/combine: weight of the reverse KL to the teacher over its top-K tokens plus a "
        "tail bin (needs teacher_top_logprobs: TURNSTREAM_SCORING_TEACHER_TOP_K on the workers)",
    )
    # Staleness
    max_staleness: int = opt(4, "policy versions a sample may lag behind the trainer")
    stale_policy: Literal["drop", "correct"] = opt(
        "correct", "stale samples: drop them (counted), or keep them with IS correction"
    )
    # DeepSpeed
    zero_stage: int = opt(1, "ZeRO stage 0-3")
    bf16: bool = opt(False, "bf16 weights and compute (GPU); fp32 on CPU")
    gradient_checkpointing: bool = opt(False, "recompute activations in backward")
    train_top_layers: int | None = opt(
        None,
        "train only the top N decoder layers and the final norm; the embeddings, the output "
        "head and the layers below stay frozen (steps cost far less on CPU); unset: all",
    )
    offload_optimizer: bool = opt(False, "ZeRO optimizer state offload to CPU")
    # Kafka, checkpoints, weight push
    group_id: str = opt("turnstream-trainer", "consumer group on samples.scored")
    checkpoint_dir: str = opt(
        ".turnstream/trainer/ckpt", "checkpoints (model, optimizer, offsets, dedup ledger)"
    )
    keep_checkpoints: int = opt(
        2, "step* checkpoints kept in checkpoint_dir, newest first (>= 1); older ones are deleted"
    )
    update_weights_interval: int = opt(1, "push weights every N optimizer steps")
    weights_dir: str = opt(".turnstream/trainer/weights", "where HF weights are saved for push")
    keep_weight_versions: int = opt(
        2, "pushed vNNNNNN weight versions kept in weights_dir (>= 1); the loaded one always stays"
    )
    policy_urls: list[str] = opt([], "SGLang policy servers to call update_weights_from_disk on")
    weight_push: Literal["auto", "full"] = opt(
        "auto",
        "auto: once the servers took a whole push and said they take deltas (turnstream "
        "serve does, SGLang does not), push only the parameters that train; full: the whole "
        "checkpoint every time",
    )
    checkpoint_frozen: bool = opt(
        True,
        "checkpoints hold the frozen parameters too; false: only those that train (with "
        "train_top_layers; a resume takes the rest from model_path, which must not change)",
    )
    weight_push_attempts: int = opt(4, "tries of one server's weight push before it is given up")
    weight_push_backoff_max_s: float = opt(
        8.0, "longest wait between tries of a weight push (0.5 s after the first, doubling)"
    )
    broker_retry_max_s: float = opt(
        5.0,
        "longest wait between tries while the broker is down (delivering what the trainer "
        "produced, committing offsets: 0.5 s after the first, doubling; until it answers)",
    )
    metrics_jsonl: str | None = opt(".turnstream/trainer/metrics.jsonl", "per-step metrics log")
    metrics_host: str = opt("127.0.0.1", "listen address of /metrics (0.0.0.0 for every interface)")
    metrics_port: int = opt(0, "Prometheus /metrics port on metrics_host (0 = off)")
    tensorboard_dir: str | None = opt(
        None, "write every metric as TensorBoard scalars here (train/*, perf/*, time/*, version/*)"
    )
    max_steps: int | None = opt(None, "stop after this many optimizer steps")

    def __post_init__(self) -> None:
        if not 0 <= self.zero_stage <= 3:
            raise ValueError(f"zero_stage must be 0..3, got {self.zero_stage}")
        if self.rollout_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("rollout_batch_size and micro_batch_size must be >= 1")
        if self.zero_stage == 3 and self.update_weights_interval:
            raise ValueError(
                "weight push with ZeRO-3 is not supported yet (parameters are "
                "partitioned); use zero_stage <= 2 or update_weights_interval: 0"
            )
        for name in ("keep_checkpoints", "keep_weight_versions", "weight_push_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.topk_distill_coef and self.mode == "rl":
            raise ValueError("topk_distill_coef needs a teacher: use mode opd or combine")
        if self.step_baseline != "none" and self.group_advantage != "none":
            raise ValueError(
                "step_baseline and group_advantage both subtract a baseline; set one of them"
            )
        if self.step_baseline != "none" and self.mode == "opd":
            raise ValueError("step_baseline applies to the rl reward: use mode rl or combine")
        if self.tis_clip < 1.0:
            raise ValueError(f"tis_clip must be >= 1, got {self.tis_clip}")
        if self.train_top_layers is not None and self.train_top_layers < 1:
            raise ValueError(f"train_top_layers must be >= 1, got {self.train_top_layers}")
        if self.teacher_adv_clip is not None and self.teacher_adv_clip <= 0:
            raise ValueError(
                f"teacher_adv_clip must be > 0 (or unset), got {self.teacher_adv_clip}"
            )
        if self.lr_schedule == "cosine" and not self.max_steps:
            raise ValueError("lr_schedule cosine needs max_steps (where the cosine ends)")
        if self.lr_warmup_steps < 0 or not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ValueError(
                f"lr_warmup_steps must be >= 0 and lr_min_ratio within [0, 1], got "
                f"{self.lr_warmup_steps} and {self.lr_min_ratio}"
            )
        if len(self.betas) != 2:
            raise ValueError(f"betas needs two values, got {self.betas}")
        for name in ("weight_push_backoff_max_s", "broker_retry_max_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def weight_push_retry(self) -> RetryPolicy:
        """How each policy server is asked again to load new weights."""
        return RetryPolicy(self.weight_push_attempts, 0.5, self.weight_push_backoff_max_s)

    @property
    def broker_retry(self) -> RetryPolicy:
        """How the trainer waits out a broker outage: no cap on tries, only a stop ends it."""
        return RetryPolicy(None, 0.5, self.broker_retry_max_s)


def config_help() -> str:
    """One line per option: name, default, help."""
    lines = []
    for f in dataclasses.fields(TrainerConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        lines.append(f"{f.name:<26} {default!r:<28} {f.metadata.get('help', '')}")
    return "\n".join(lines)


def load_trainer_config(path: Path | None, **overrides: Any) -> TrainerConfig:
    """Read a YAML file of options; unknown keys are an error naming the file and key."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read trainer config {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of option: value")
        data = loaded
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainerConfig(**{str(k): v for k, v in data.items()})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        unknown = sorted(
            str(e["loc"][0]) for e in errors if e["type"] == "unexpected_keyword_argument"
        )
        if unknown:  # a misspelt key first: its value errors may follow from it
            raise ConfigError(
                f"{path or 'overrides'}: unknown option(s) {unknown}{_did_you_mean(unknown)}; "
                "see `turnstream train --help-config`"
            ) from exc
        err = errors[0]
        where = ".".join(str(p) for p in err["loc"]) or "value"
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{path or 'overrides'}: option {where}: {msg}") from exc


def _did_you_mean(unknown: list[str]) -> str:
    """The options nearest each unknown one, as `` (lr_rate: did you mean lr?)``."""
    known = [f.name for f in dataclasses.fields(TrainerConfig)]
    hints = [
        f"{key}: did you mean {' or '.join(close)}?"
        for key in unknown
        if (close := difflib.get_close_matches(key, known, n=3))
    ]
    return f" ({' '.join(hints)})" if hints else ""
