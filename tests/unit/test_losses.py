"""Losses against values computed by hand on small fixed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.losses import (
    combine_advantages,
    entropy_from_logits,
    kl_to_reference,
    opd_advantages,
    ppo_clip_loss,
    rl_advantages,
    token_mean,
    topk_reverse_kl,
    truncated_is_weights,
)

T = torch.tensor


def test_token_mean_ignores_masked_tokens() -> None:
    assert token_mean(T([[1.0, 2.0, 9.0]]), T([[1, 1, 0]])).item() == pytest.approx(1.5)
    assert token_mean(T([[5.0]]), T([[0]])).item() == 0.0


def test_advantages() -> None:
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert rl_advantages(T([1.0, -1.0]), mask).tolist() == [[1, 1, 0], [-1, 0, 0]]
    teacher, old = T([[-0.5, -1.0, -2.0]]), T([[-1.0, -1.0, -1.0]])
    assert opd_advantages(teacher, old, mask[:1]).tolist() == [[0.5, 0.0, 0.0]]
    comb = combine_advantages(teacher, old, T([1.0]), mask[:1], w_opd=2.0, w_rl=0.5)
    assert comb.tolist() == [[1.5, 0.5, 0.0]]  # 2*0.5 + 0.5*1, 2*0 + 0.5*1, masked


def test_ppo_clip_by_hand() -> None:
    # token 1: ratio e^0.5=1.6487, A=+1 -> clipped at 1.28: loss -1.28 (clipped)
    # token 2: ratio e^-0.5=0.6065, A=+1 -> min(0.6065, 0.8)=0.6065: loss -0.6065
    # token 3: ratio e^0.5, A=-1 -> max(1.6487, 1.28) = 1.6487: loss +1.6487
    # token 4: ratio e^-0.5, A=-1 -> clipped at 0.8: loss +0.8 (clipped)
    old = torch.zeros(1, 4)
    new = T([[0.5, -0.5, 0.5, -0.5]])
    adv = T([[1.0, 1.0, -1.0, -1.0]])
    stats = ppo_clip_loss(new, old, adv, torch.ones(1, 4), eps=0.2, eps_high=0.28)
    expected = (-1.28 - math.exp(-0.5) + math.exp(0.5) + 0.8) / 4
    assert stats.pg_loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats.clipfrac.item() == pytest.approx(0.5)
    assert stats.approx_kl.item() == pytest.approx(0.0)


def test_ppo_on_policy_equals_minus_mean_advantage_and_has_the_pg_gradient() -> None:
    logp = T([[-1.0, -2.0]], requires_grad=True)
    adv = T([[0.5, -1.5]])
    stats = ppo_clip_loss(logp, logp.detach(), adv, torch.ones(1, 2))
    assert stats.pg_loss.item() == pytest.approx(0.5)  # -(0.5 - 1.5) / 2
    stats.pg_loss.backward()
    assert logp.grad is not None and logp.grad.tolist() == [[-0.25, 0.75]]  # -A / n


def test_truncated_importance_weights() -> None:
    w = truncated_is_weights(T([[-1.0, -1.0]]), T([[-1.0, -2.0]]), clip=2.0)
    assert w.tolist()[0][0] == pytest.approx(1.0)
    assert w.tolist()[0][1] == pytest.approx(2.0)  # e^1 = 2.718 truncated at 2
    weighted = ppo_clip_loss(
        torch.zeros(1, 2), torch.zeros(1, 2), T([[1.0, 1.0]]), torch.ones(1, 2), is_weights=w
    )
    assert weighted.pg_loss.item() == pytest.approx(-(1.0 + 2.0) / 2)


def test_kl_estimators_by_hand() -> None:
    logp, ref = T([[-1.0, -2.0]]), T([[-1.5, -1.0]])
    mask = torch.ones(1, 2)
    # log r = ref - logp = [-0.5, 1.0]; k1 = -log r; k3 = e^{log r} - 1 - log r
    assert kl_to_reference(logp, ref, mask, "k1").item() == pytest.approx((0.5 - 1.0) / 2)
    k3 = ((math.exp(-0.5) - 1 + 0.5) + (math.exp(1.0) - 1 - 1.0)) / 2
    assert kl_to_reference(logp, ref, mask, "k3").item() == pytest.approx(k3)


def test_entropy_of_uniform_and_peaked() -> None:
    logits = T([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    assert entropy_from_logits(logits, T([[1.0, 0.0]])).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(logits, T([[0.0, 1.0]])).item() == pytest.approx(0.0, abs=1e-6)


def test_topk_reverse_kl_by_hand() -> None:
    # K=2. student p=[0.5, 0.25] tail 0.25; teacher q=[0.25, 0.25] tail 0.5.
    s = torch.log(T([[[0.5, 0.25]]]))
    t = torch.log(T([[[0.25, 0.25]]]))
    expected = 0.5 * math.log(2) + 0.25 * 0.0 + 0.25 * math.log(0.5)
    got = topk_reverse_kl(s, t, torch.ones(1, 1)).item()
    assert got == pytest.approx(expected, rel=1e-5)
    assert topk_reverse_kl(t, t, torch.ones(1, 1)).item() == pytest.approx(0.0, abs=1e-6)


def test_topk_tail_is_clamped_when_topk_covers_everything() -> None:
    s = torch.log(T([[[0.5, 0.5]]]))
    t = torch.log(T([[[0.9, 0.1]]]))
    got = topk_reverse_kl(s, t, torch.ones(1, 1)).item()
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)  # tail mass ~1e-6
    assert got == pytest.approx(expected, rel=1e-4)
