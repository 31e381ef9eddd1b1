"""Policy-gradient losses and advantages as pure tensor functions.

Shapes: ``[B, T]`` over response tokens, with ``mask`` 1 for tokens that count
(the sample's ``loss_mask`` times the response's token mask). Every reduction
is a token mean over the mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Tensor = torch.Tensor


def token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the tokens where ``mask`` is 1 (0 when none is)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def rl_advantages(rewards: Tensor, mask: Tensor) -> Tensor:
    """The sample's reward broadcast over its response tokens."""
    return rewards.float()[:, None] * mask.float()


def opd_advantages(teacher_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-token teacher_logprob - old_logprob (on-policy distillation)."""
    return (teacher_logprobs - old_logprobs) * mask


def combine_advantages(
    teacher_logprobs: Tensor,
    old_logprobs: Tensor,
    rewards: Tensor,
    mask: Tensor,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
) -> Tensor:
    """w_opd * (teacher - old) + w_rl * reward, per token."""
    return w_opd * opd_advantages(teacher_logprobs, old_logprobs, mask) + w_rl * rl_advantages(
        rewards, mask
    )


def truncated_is_weights(
    train_old_logprobs: Tensor, rollout_logprobs: Tensor, clip: float = 2.0
) -> Tensor:
    """Truncated importance weights min(pi_train_old / pi_rollout, clip), no gradient.

    Corrects the mismatch between the log-probs the serving engine reported
    and the ones the trainer computes for the same tokens.
    """
    return torch.exp(train_old_logprobs - rollout_logprobs).clamp(max=clip).detach()


@dataclass(frozen=True)
class PPOStats:
    pg_loss: Tensor
    clipfrac: Tensor
    approx_kl: Tensor


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps: float = 0.2,
    eps_high: float = 0.28,
    is_weights: Tensor | None = None,
) -> PPOStats:
    """PPO clipped surrogate with asymmetric clip [1 - eps, 1 + eps_high], token mean.

    ``approx_kl`` is the mean of (old - new) log-probs (k1), as logged as ppo_kl.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        per_token = per_token * is_weights
    pg_loss = token_mean(per_token, mask)
    clipfrac = token_mean((clipped > unclipped).to(logprobs.dtype), mask)
    approx_kl = token_mean(-log_ratio, mask)
    return PPOStats(pg_loss, clipfrac.detach(), approx_kl.detach())


def kl_to_reference(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kind: Literal["k1", "k3"] = "k3"
) -> Tensor:
    """KL(pi || ref) estimate per token, token mean: k1 = log r, k3 = r - 1 - log r (r = ref/pi)."""
    log_r = ref_logprobs - logprobs
    per_token = -log_r if kind == "k1" else torch.exp(log_r) - 1.0 - log_r
    return token_mean(per_token, mask)


def entropy_from_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """Token-mean entropy of the policy's next-token distributions."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return token_mean(-(logp.exp() * logp).sum(-1), mask)


def topk_reverse_kl(
    student_logprobs_at_teacher_topk: Tensor,
    teacher_topk_logprobs: Tensor,
    mask: Tensor,
    min_tail: float = 1e-6,
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
    return token_mean(per_token, mask)
