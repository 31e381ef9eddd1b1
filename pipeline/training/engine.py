"""The policy under DeepSpeed: one optimizer step over a batch of micro-batches.

On CPU (tests, CI, the demo) it runs the same code with ``DS_ACCELERATOR=cpu``,
the gloo backend and fp32; on GPUs with bf16 and ZeRO 2/3, launched by the
``deepspeed`` launcher.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.broker.local import free_port_pair
from pipeline.errors import ConfigError
from pipeline.models.decoder import logits_from
from pipeline.training import losses
from pipeline.training.batch import MicroBatch
from pipeline.training.config import TrainerConfig
from pipeline.training.reference import build_reference
from pipeline.training.top_layers import Frozen, build_top_layers


def setup_distributed() -> str:
    """Initialise torch.distributed once (a single process unless a launcher set it up)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port_pair()))
    import deepspeed

    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    return device


def close_distributed() -> None:
    """End the process group once every rank is done: left to the interpreter's exit,
    gloo's threads can outlive it and abort the process ("terminate called without an
    active exception"), turning a finished run into exit status -6."""
    if not torch.distributed.is_initialized():
        return
    if torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def build_model(config: TrainerConfig, vocab_size: int) -> torch.nn.Module:
    """The policy: a local HF checkpoint, or a tiny random Qwen2-style model."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(config.seed)
    dtype = torch.bfloat16 if config.bf16 else torch.float32
    if config.model_path:
        model = AutoModelForCausalLM.from_pretrained(
            config.model_path, dtype=dtype, local_files_only=True
        )
    else:
        sizes: dict[str, Any] = dict(config.tiny_model)
        tiny = Qwen2Config(
            vocab_size=vocab_size,
            max_position_embeddings=config.max_seq_len,
            tie_word_embeddings=True,
            **sizes,
        )
        model = AutoModelForCausalLM.from_config(tiny, dtype=dtype)
    if config.train_top_layers is not None:
        freeze_below_top(model, config.train_top_layers)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def freeze_below_top(model: torch.nn.Module, top: int) -> None:
    """Leave only the top ``top`` decoder layers and the final norm trainable."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(
            f"train_top_layers: {type(model).__name__} has no model.layers to choose from; "
            "unset train_top_layers to train every parameter"
        )
    if top > len(layers):
        raise ConfigError(f"train_top_layers is {top} but the model has {len(layers)} layers")
    model.requires_grad_(False)
    for layer in layers[len(layers) - top :]:
        layer.requires_grad_(True)
    norm = getattr(inner, "norm", None)
    if isinstance(norm, torch.nn.Module):
        norm.requires_grad_(True)


def deepspeed_config(config: TrainerConfig) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": config.zero_stage}
    if config.offload_optimizer and config.zero_stage > 0:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": config.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": config.lr,
                "betas": list(config.betas),
                "weight_decay": config.weight_decay,
                # torch's AdamW needs no compiled op; offload needs DeepSpeed's CPU Adam.
                "torch_adam": not config.offload_optimizer,
            },
        },
        "zero_optimization": zero,
        "bf16": {"enabled": config.bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def lr_factor(step: int, config: TrainerConfig) -> float:
    """The share of ``lr`` that optimizer step ``step`` (0 for the first) updates with:
    ``lr_warmup_steps`` linear steps up, then 1 (constant) or a half cosine down to
    ``lr_min_ratio`` at the last of ``max_steps`` steps (and there after)."""
    warmup = config.lr_warmup_steps
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if config.lr_schedule == "constant" or config.max_steps is None:
        return 1.0
    span = max(config.max_steps - 1 - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    low = config.lr_min_ratio
    return low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_scheduler(optimizer: Any, config: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule DeepSpeed steps after each optimizer step (and keeps in its checkpoints:
    the step count, from which a resumed run takes up the same lr)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_factor, config=config))


def token_logprobs(model: Any, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L-1] log-prob of each next token from ``mb``'s first response position on, 0
    before it; [B, L-1-start, V] the logits of those positions)."""
    start = mb.response_from
    _out, logits = logits_from(model, mb.input_ids, start, attention_mask=mb.attention_mask)
    return losses.window_logprobs(logits, mb.input_ids, start), logits


def rollout_abs_diff(mb: MicroBatch, old: torch.Tensor) -> float | None:
    """Mean |old - rollout| over the response tokens that have a rollout log-prob."""
    known = mb.response_mask * torch.isfinite(mb.rollout_logprobs)
    if not bool(known.any()):
        return None
    gap = (old - mb.rollout_logprobs.nan_to_num()).abs()
    return float((gap * known).sum() / known.sum())


@dataclass(frozen=True)
class Before:
    """A micro-batch's pass before the update: the proximal log-probs (None: the training
    pass's own, see :meth:`PolicyEngine._before_update`), the reference's, and the hidden
    state below the trained layers (None: the training pass runs whole)."""

    old: torch.Tensor | None
    ref: torch.Tensor | None
    hidden: Frozen | None


@dataclass
class StepMetrics:
    """One optimizer step's figures. Its forward passes run on the weights the step started
    from, so ``entropy`` and ``kl`` (to the initial policy) are those weights'; its samples
    give ``reward_mean`` and ``response_length`` (tokens)."""

    step: int
    samples: int
    loss: float
    pg_loss: float
    pg_clipfrac: float
    ppo_kl: float
    entropy: float
    kl: float
    reward_mean: float
    response_length: float
    tokens: int
    tokens_per_s: float
    train_rollout_logprob_abs_diff: float | None
    rollout_kl: float = 0.0
    tis_weight_mean: float = 1.0
    tis_clipfrac: float = 0.0
    topk_kl: float = 0.0
    teacher_gap: float = 0.0  # opd/combine: mean teacher - old (unclipped) over taught tokens
    samples_per_s: float = 0.0  # the step's samples (every rank's) over its time, as tokens_per_s
    lr: float = 0.0  # the learning rate of the step's update (lr_schedule)


SUMMED = (
    "loss",
    "pg_loss",
    "clipfrac",
    "ppo_kl",
    "rollout_kl",
    "tis_weight_mean",
    "tis_clipfrac",
    "entropy",
    "kl",
    "topk_kl",
    "teacher_gap",
)


class PolicyEngine:
    """Holds the DeepSpeed engine; ``train_step`` is one optimizer step."""

    def __init__(self, config: TrainerConfig, vocab_size: int) -> None:
        import deepspeed

        self.config = config
        self.device = setup_distributed()
        model = build_model(config, vocab_size)
        self.reference = build_reference(config, model, self.device)  # the initial weights
        self.top = build_top_layers(config, model)  # None: the training pass runs it whole
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=deepspeed_config(config),
            lr_scheduler=functools.partial(lr_scheduler, config=config),
        )
        self.steps = 0

    def _to_device(self, mb: MicroBatch) -> MicroBatch:
        if self.device == "cpu":
            return mb
        moved: dict[str, Any] = {
            k: v.to(self.device) for k, v in vars(mb).items() if isinstance(v, torch.Tensor)
        }
        return dataclasses.replace(mb, **moved)

    @torch.no_grad()
    def logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """The policy's log-probs of ``mb``'s tokens now (no dropout, no gradient)."""
        self.engine.eval()
        logp, _ = token_logprobs(self.engine, self._to_device(mb))
        self.engine.train()
        return logp

    def reference_logprobs(self, mb: MicroBatch) -> torch.Tensor | None:
        """The initial policy's log-probs of ``mb``'s tokens (None without a reference)."""
        return self._before_update(self._to_device(mb)).ref

    @torch.no_grad()
    def _before_update(self, mb: MicroBatch) -> Before:
        """The policy's log-probs before the update (the proximal policy), the reference's
        (None without one), and the hidden state below the trained layers, from one pass: a
        top-layer reference and the training pass (:mod:`~pipeline.training.top_layers`)
        start from that hidden state. With top layers that pass stops below them, and the
        proximal log-probs are None: the training pass's own (:meth:`_micro_loss`)."""
        ref = self.reference
        ref_layer = None if ref is None else ref.hidden_layer
        top_layer = None if self.top is None else self.top.hidden_layer
        if self.top is not None and ref_layer in (None, top_layer):
            # only the frozen layers: the top layers and the head run once, in the training
            # pass, whose log-probs are the proximal ones (one update a step, after it)
            self.engine.eval()
            frozen = self.top.frozen_hidden(self.engine.module, mb)
            self.engine.train()
            return Before(None, None if ref is None else ref.logprobs(mb, frozen), frozen)
        self.engine.eval()
        start = mb.response_from
        out, logits = logits_from(
            self.engine,
            mb.input_ids,
            start,
            attention_mask=mb.attention_mask,
            output_hidden_states=ref_layer is not None or top_layer is not None,
        )
        self.engine.train()
        old = losses.window_logprobs(logits, mb.input_ids, start)
        hidden = None if top_layer is None else out.hidden_states[top_layer]
        if ref is None:
            return Before(old, None, hidden)
        below = None if ref_layer is None else out.hidden_states[ref_layer]
        return Before(old, ref.logprobs(mb, below), hidden)

    def train_step(
        self,
        batches: list[MicroBatch],
        total_tokens: int | None = None,
        total_samples: int | None = None,
        update: bool = True,
    ) -> StepMetrics:
        """One optimizer step over the step's response tokens, aggregated by ``loss_agg``.

        With several ranks each passes its own shard of micro-batches and the
        step's ``total_tokens`` and ``total_samples``; DeepSpeed averages
        gradients over ranks, so each rank scales its loss by the world size to
        keep one aggregate over the whole step.

        ``update`` False: a step with nothing to learn (see ``alike_steps`` skip) is
        measured, no gradient, and leaves the weights and Adam's moments as they are
        (no momentum carries them on); it counts, and the lr schedule moves on.
        """
        started = time.perf_counter()
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        batches = [self._to_device(mb) for mb in batches]
        before = [self._before_update(mb) for mb in batches]
        olds: list[torch.Tensor] = []
        tokens = total_tokens if total_tokens is not None else sum(mb.tokens for mb in batches)
        samples = total_samples if total_samples is not None else sum(mb.samples for mb in batches)
        total = tokens if self.config.loss_agg == "token_mean" else samples
        sums = dict.fromkeys(SUMMED, 0.0)
        self.engine.train()
        for i, (mb, b) in enumerate(zip(batches, before, strict=True)):
            with torch.set_grad_enabled(update):
                parts = self._micro_loss(mb, b.old, b.ref, b.hidden)
            olds.append(parts.pop("old"))
            weight = losses.agg_units(mb.response_mask, self.config.loss_agg) / max(total, 1)
            if update:
                self.engine.set_gradient_accumulation_boundary(i == len(batches) - 1)
                self.engine.backward(parts["loss"] * weight * world)
            for key in sums:
                sums[key] += float(parts[key].detach()) * weight
        lr = float(self.engine.get_lr()[0])
        if update:
            self.engine.step()
        elif self.engine.lr_scheduler is not None:
            with warnings.catch_warnings():  # before any update: the step it skips is counted
                warnings.filterwarnings(
                    "ignore", "Detected call of `lr_scheduler.step", UserWarning
                )
                self.engine.lr_scheduler.step()
        self.steps += 1
        if world > 1:  # metrics of the whole step, not of this rank's shard
            summed = torch.tensor([sums[k] for k in sums], dtype=torch.float64)
            torch.distributed.all_reduce(summed)
            sums = dict(zip(sums, summed.tolist(), strict=True))
        elapsed = time.perf_counter() - started
        return dataclasses.replace(
            self._metrics(batches, olds, sums, (tokens, samples), elapsed), lr=lr
        )

    def _metrics(
        self,
        batches: list[MicroBatch],
        olds: list[torch.Tensor],
        sums: dict[str, float],
        totals: tuple[int, int],
        elapsed: float,
    ) -> StepMetrics:
        """The step's figures; ``totals``: its (tokens, samples) over every rank."""
        diffs = [rollout_abs_diff(mb, old) for mb, old in zip(batches, olds, strict=True)]
        known = [d for d in diffs if d is not None]
        rewards = torch.cat([mb.rewards for mb in batches])
        lengths = torch.cat([mb.response_mask.sum(-1) for mb in batches])
        tokens, samples = totals
        rate = 1 / elapsed if elapsed > 0 else 0.0
        return StepMetrics(
            step=self.steps,
            samples=sum(len(mb.sample_ids) for mb in batches),
            loss=sums["loss"],
            pg_loss=sums["pg_loss"],
            pg_clipfrac=sums["clipfrac"],
            ppo_kl=sums["ppo_kl"],
            entropy=sums["entropy"],
            kl=sums["kl"],
            reward_mean=float(rewards.mean()),
            response_length=float(lengths.float().mean()),
            tokens=tokens,
            tokens_per_s=tokens * rate,
            train_rollout_logprob_abs_diff=sum(known) / len(known) if known else None,
            rollout_kl=sums["rollout_kl"],
            tis_weight_mean=sums["tis_weight_mean"],
            tis_clipfrac=sums["tis_clipfrac"],
            topk_kl=sums["topk_kl"],
            teacher_gap=sums["teacher_gap"],
            samples_per_s=samples * rate,
        )

    def _train_logprobs(
        self, mb: MicroBatch, hidden: Frozen | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The training pass's log-probs [B, L-1] and the logits from the first response
        position (:func:`token_logprobs`): the top layers only on ``hidden`` (the frozen
        layers' output) when there is one, else the whole model."""
        if self.top is not None and hidden is not None:
            logits = self.top.logits(self.engine.module, mb, hidden)
            return losses.window_logprobs(logits, mb.input_ids, mb.response_from), logits
        return token_logprobs(self.engine, mb)

    def _micro_loss(
        self,
        mb: MicroBatch,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        hidden: Frozen | None = None,
    ) -> dict[str, torch.Tensor]:
        """The loss of one micro-batch (policy loss, entropy, KL, top-K) and its parts, with
        the proximal log-probs as ``old``; ``old`` None: this pass's own, detached (the
        weights have not moved since the step began); ``ref`` is the initial policy's
        log-probs (None: no reference, the KL is 0); ``hidden``, the frozen layers' output,
        runs the top layers only."""
        c = self.config
        mask = mb.response_mask
        logp, logits = self._train_logprobs(mb, hidden)
        old = logp.detach() if old is None else old
        adv = losses.sample_advantages(
            c.mode, mb.rewards, mb.teacher_for(old), mb.has_teacher, old, mask, c.w_opd,
            c.w_rl, c.teacher_adv_clip, c.teacher_baseline == "mean",
        )  # fmt: skip
        stats = losses.policy_loss(
            logp,
            old,
            mb.rollout_logprobs,
            adv,
            mask,
            eps=c.eps_clip,
            eps_high=c.eps_clip_high,
            tis_clip=c.tis_clip,
            agg=c.loss_agg,
        )
        loss = stats.pg_loss
        entropy = losses.entropy_from_logits(
            logits if c.entropy_coef else logits.detach(), mask[:, mb.response_from :], c.loss_agg
        )
        if c.entropy_coef:
            loss = loss - c.entropy_coef * entropy
        kl, topk, gap = self._side_terms(mb, logp, logits, old, ref)
        loss = loss + c.kl_coef * kl + c.topk_distill_coef * topk
        return {
            "loss": loss,
            "pg_loss": stats.pg_loss.detach(),
            "clipfrac": stats.clipfrac,
            "ppo_kl": stats.ppo_kl,
            "rollout_kl": stats.rollout_kl,
            "tis_weight_mean": stats.tis_weight_mean,
            "tis_clipfrac": stats.tis_clipfrac,
            "entropy": entropy.detach(),
            "kl": kl.detach(),
            "topk_kl": topk.detach(),
            "teacher_gap": gap,
            "old": old,
        }

    def _side_terms(
        self,
        mb: MicroBatch,
        logp: torch.Tensor,
        logits: torch.Tensor,
        old: torch.Tensor,
        ref: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """KL to the initial policy (a gradient only where kl_coef penalises it), the top-K
        reverse KL to the teacher (where topk_distill_coef weighs it) and the teacher gap
        (teacher - old over the taught tokens: what OPD raises; no gradient); 0 when absent."""
        c, mask = self.config, mb.response_mask
        kl = topk = gap = torch.zeros(())
        if ref is not None:  # measured always
            policy = logp if c.kl_coef else logp.detach()
            kl = losses.kl_to_reference(policy, ref, mask, c.kl_kind, c.loss_agg)
        ids, top, has_top = mb.teacher_topk_ids, mb.teacher_topk_logprobs, mb.has_teacher_topk
        if c.topk_distill_coef and ids is not None and top is not None and has_top is not None:
            start = mb.response_from  # ``logits`` are those of the positions from there on
            topk_mask = (mask * has_top.to(mask.dtype)[:, None])[:, start:]
            topk = losses.topk_distill_loss(
                logits, ids[:, start:], top[:, start:], topk_mask, c.loss_agg
            )
        if c.mode != "rl":
            taught = mask * mb.has_teacher.to(mask.dtype)[:, None]
            gap = losses.aggregate((mb.teacher_for(old) - old).detach(), taught, c.loss_agg)
        return kl, topk, gap

    def parameters_snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.engine.module.parameters()]
