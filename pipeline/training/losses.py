"""Policy-gradient losses and advantages as pure tensor functions.

Shapes: ``[B, T]`` over next-token positions, with ``mask`` 1 for the response
tokens that count. ``agg`` turns per-token values into one number:
``token_mean`` weighs every token of the batch the same (long responses weigh
more); ``seq_mean_token_mean`` takes each sample's token mean, then the mean
over samples (what slime, and so OpenClaw-RL, does by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Tensor = torch.Tensor
Agg = Literal["token_mean", "seq_mean_token_mean"]
Mode = Literal["rl", "opd", "combine"]


def token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the tokens where ``mask`` is 1 (0 when none is)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def seq_mean_token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over the samples that have a masked token of each one's token mean."""
    mask = mask.to(values.dtype)
    counts = mask.sum(-1)
    per_sample = (values * mask).sum(-1) / counts.clamp(min=1.0)
    present = (counts > 0).to(values.dtype)
    return (per_sample * present).sum() / present.sum().clamp(min=1.0)


def aggregate(values: Tensor, mask: Tensor, agg: Agg) -> Tensor:
    """``values`` reduced to one number the way ``agg`` says."""
    if agg == "token_mean":
        return token_mean(values, mask)
    if agg == "seq_mean_token_mean":
        return seq_mean_token_mean(values, mask)
    raise ValueError(f"unknown loss aggregation {agg!r}")


def agg_units(mask: Tensor, agg: Agg) -> int:
    """What ``agg`` averages over in ``mask``: its tokens, or its samples that have one."""
    if agg == "token_mean":
        return int(mask.sum().item())
    return int((mask.sum(-1) > 0).sum().item())


def next_token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """[B, L-1] log-prob of each next token of ``input_ids`` [B, L] under ``logits``
    [B, L-1, V] (the logits at every position but the last)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def window_logprobs(logits: Tensor, input_ids: Tensor, start: int) -> Tensor:
    """[B, L-1] next-token log-probs from ``logits`` [B, L-1-start, V], those of positions
    ``start``.. only; 0 at the positions before ``start`` (prompt in every row)."""
    logp = next_token_logprobs(logits, input_ids[:, start:])
    return torch.nn.functional.pad(logp, (start, 0))


def rl_advantages(rewards: Tensor, mask: Tensor) -> Tensor:
    """The sample's reward broadcast over its response tokens."""
    return rewards.float()[:, None] * mask.float()


def opd_advantages(
    teacher_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    clip: float | None = None,
    centre: bool = False,
) -> Tensor:
    """Per-token teacher_logprob - old_logprob (on-policy distillation).

    ``centre``: less its mean over ``mask`` (a baseline: the sampled-token estimate of the
    reverse KL's gradient stays unbiased, and its mean, -KL, no longer pushes every sampled
    token down, which flattens the policy); then limited to [-clip, clip] nats when ``clip``
    is given."""
    gap = teacher_logprobs - old_logprobs
    if centre:
        gap = gap - token_mean(gap, mask)
    if clip is not None:
        gap = gap.clamp(-clip, clip)
    return gap * mask


def combine_advantages(
    teacher_logprobs: Tensor,
    old_logprobs: Tensor,
    rewards: Tensor,
    mask: Tensor,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
    teacher_mask: Tensor | None = None,
    clip: float | None = None,
    centre: bool = False,
) -> Tensor:
    """w_opd * (teacher - old) + w_rl * reward, per token.

    ``teacher_mask`` (default ``mask``) limits the teacher term to the tokens
    that have a teacher log-prob; the reward term covers all of ``mask``; ``clip`` and
    ``centre`` shape teacher - old (:func:`opd_advantages`).
    """
    opd_mask = mask if teacher_mask is None else teacher_mask
    teach = opd_advantages(teacher_logprobs, old_logprobs, opd_mask, clip, centre)
    return w_opd * teach + w_rl * rl_advantages(rewards, mask)


def sample_advantages(
    mode: Mode,
    rewards: Tensor,
    teacher_logprobs: Tensor,
    has_teacher: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
    clip: float | None = None,
    centre: bool = False,
) -> Tensor:
    """Per-token advantages of a micro-batch in ``mode``; ``old`` is the trainer's own.

    A sample without a teacher signal (``has_teacher`` false) gets no OPD term; ``centre``
    takes teacher - old relative to its mean over the micro-batch's taught tokens, and
    ``clip`` limits it to [-clip, clip] nats (neither: OpenClaw-RL's).
    """
    if mode == "rl":
        return rl_advantages(rewards, mask)
    teacher_mask = mask * has_teacher.to(mask.dtype)[:, None]
    if mode == "opd":
        return opd_advantages(teacher_logprobs, old_logprobs.detach(), teacher_mask, clip, centre)
    return combine_advantages(
        teacher_logprobs, old_logprobs.detach(), rewards, mask, w_opd, w_rl, teacher_mask, clip,
        centre,
    )  # fmt: skip


def behaviour_log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor | None) -> Tensor:
    """old - rollout per token, no gradient; 0 where the serving engine reported
    no log-prob (a NaN entry, or no tensor at all)."""
    old = old_logprobs.detach()
    if rollout_logprobs is None:
        return torch.zeros_like(old)
    known = torch.isfinite(rollout_logprobs)
    return old - torch.where(known, rollout_logprobs, old)


def behaviour_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor | None, tis_clip: float
) -> Tensor:
    """w = min(exp(old - rollout), tis_clip), no gradient; 1 (no correction) where
    a token has no rollout log-prob."""
    return torch.exp(behaviour_log_ratio(old_logprobs, rollout_logprobs)).clamp(max=tis_clip)


@dataclass(frozen=True)
class PPOStats:
    """The policy loss of a micro-batch and what to log about it.

    ``ppo_kl`` estimates KL(old || θ) with k1 (old - logp), as slime logs it;
    ``rollout_kl`` estimates KL(rollout || old), the serving/trainer mismatch,
    with k3 (q - 1 - log q, q = π_old/π_rollout; never negative), over the
    tokens that have a rollout log-prob.
    """

    pg_loss: Tensor
    clipfrac: Tensor
    ppo_kl: Tensor
    rollout_kl: Tensor
    tis_weight_mean: Tensor
    tis_clipfrac: Tensor


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    rollout_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps: float,
    eps_high: float,
    tis_clip: float,
    agg: Agg,
) -> PPOStats:
    """Decoupled PPO with one truncated importance correction (verl TIS, AReaL).

    r = exp(logp - old) clipped to [1 - eps, 1 + eps_high], with ``old`` the
    trainer's own log-probs before the update; w = min(exp(old - rollout), C)
    corrects for the serving engine's policy. Per token -w·min(r·A, clip(r)·A),
    then ``agg``.
    """
    old = old_logprobs.detach()
    ratio = torch.exp(logprobs - old)
    clipped_ratio = ratio.clamp(1.0 - eps, 1.0 + eps_high)
    unclipped, clipped = ratio * advantages, clipped_ratio * advantages
    log_q = behaviour_log_ratio(old, rollout_logprobs)
    weight = torch.exp(log_q).clamp(max=tis_clip)
    pg_loss = aggregate(-weight * torch.minimum(unclipped, clipped), mask, agg)
    fmask = mask.to(logprobs.dtype)
    with torch.no_grad():
        clipfrac = aggregate((clipped < unclipped).to(logprobs.dtype), fmask, agg)
        ppo_kl = aggregate(old - logprobs, fmask, agg)
        rollout_kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        if rollout_logprobs is not None:
            known = fmask * torch.isfinite(rollout_logprobs).to(fmask.dtype)
            rollout_kl = aggregate(torch.exp(log_q) - 1.0 - log_q, known, agg)
        tis_weight_mean = aggregate(weight, fmask, agg)
        tis_clipfrac = aggregate((log_q > math.log(tis_clip)).to(logprobs.dtype), fmask, agg)
    return PPOStats(pg_loss, clipfrac, ppo_kl, rollout_kl, tis_weight_mean, tis_clipfrac)


def kl_to_reference(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kind: Literal["k1", "k3"] = "k3",
    agg: Agg = "token_mean",
) -> Tensor:
    """KL(pi || ref) per token, then ``agg``: k1 = -log r, k3 = r - 1 - log r (r = ref/pi)."""
    log_r = ref_logprobs - logprobs
    per_token = -log_r if kind == "k1" else torch.exp(log_r) - 1.0 - log_r
    return aggregate(per_token, mask, agg)


def entropy_from_logits(logits: Tensor, mask: Tensor, agg: Agg = "token_mean") -> Tensor:
    """Entropy of the policy's next-token distributions, reduced by ``agg``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return aggregate(-(logp.exp() * logp).sum(-1), mask, agg)


def topk_reverse_kl(
    student_logprobs_at_teacher_topk: Tensor,
    teacher_topk_logprobs: Tensor,
    mask: Tensor,
    min_tail: float = 1e-6,
    agg: Agg = "token_mean",
) -> Tensor:
    """Reverse KL(student || teacher) over the teacher's K tokens plus one tail bin.

    Both inputs are ``[B, T, K]`` log-probs of the same K token ids (the
    teacher's top-K at each position). The tail bin holds the rest of each
    distribution, log(1 - sum p), with its mass clamped to at least ``min_tail``.
    """

    def with_tail(logp: Tensor) -> Tensor:
        tail = (1.0 - logp.exp().sum(-1, keepdim=True)).clamp(min=min_tail).log()
        return torch.cat([logp, tail], dim=-1)

    s = with_tail(student_logprobs_at_teacher_topk)
    t = with_tail(teacher_topk_logprobs)
    per_token = (s.exp() * (s - t)).sum(-1)
    return aggregate(per_token, mask, agg)


def topk_distill_loss(
    student_logits: Tensor,
    teacher_topk_ids: Tensor,
    teacher_topk_logprobs: Tensor,
    mask: Tensor,
    agg: Agg = "token_mean",
) -> Tensor:
    """:func:`topk_reverse_kl` with the student's log-probs gathered at the teacher's ids.

    ``student_logits`` is ``[B, T, V]``; ``teacher_topk_ids`` and
    ``teacher_topk_logprobs`` are ``[B, T, K]``.
    """
    student = torch.log_softmax(student_logits.float(), dim=-1).gather(-1, teacher_topk_ids)
    return topk_reverse_kl(student, teacher_topk_logprobs.float(), mask, agg=agg)
