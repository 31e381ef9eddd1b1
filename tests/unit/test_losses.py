"""Losses against values computed by hand on small fixed tensors.

The policy-loss cases feed rollout log-probs that differ from the trainer's
old log-probs (mismatch 0, 0.1, 0.3 nats either way and one truncated weight),
advantages of both signs, and ratios inside and outside the clip range.
"""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.losses import (
    agg_units,
    aggregate,
    behaviour_weights,
    combine_advantages,
    entropy_from_logits,
    kl_to_reference,
    opd_advantages,
    policy_loss,
    rl_advantages,
    sample_advantages,
    seq_mean_token_mean,
    token_mean,
    topk_distill_loss,
    topk_reverse_kl,
)

T = torch.tensor
NAN = math.nan
EPS, EPS_HIGH, C = 0.2, 0.28, 2.0

# One row per response token: (logp - old, old, old - rollout or None, advantage).
# Sample 0 has tokens 0-3, sample 1 tokens 4-5 and one masked position.
TOKENS = [
    (0.0, -1.0, 0.0, 1.0),  # mismatch 0: w = 1
    (0.0, -1.0, 0.1, 1.0),  # mismatch 0.1: w = e^0.1
    (0.0, -2.0, -0.3, -1.0),  # mismatch -0.3: w = e^-0.3, negative advantage
    (0.5, -0.5, 0.3, 1.0),  # mismatch 0.3, r = e^0.5 clipped at 1.28
    (-0.1, -0.2, 1.3, -1.0),  # w = e^1.3 = 3.67 truncated at C = 2, r inside the clip range
    (0.2, -1.0, None, 1.0),  # no rollout log-prob (end-of-turn token): w = 1
]


def by_hand(delta: float, log_q: float | None, adv: float) -> tuple[float, float, bool]:
    """(per-token loss, behaviour weight, clipped) of one token, from the formulas."""
    w = min(math.exp(log_q), C) if log_q is not None else 1.0
    r = math.exp(delta)
    clipped_r = min(max(r, 1 - EPS), 1 + EPS_HIGH)
    return -w * min(r * adv, clipped_r * adv), w, clipped_r * adv < r * adv


def tensors() -> tuple[torch.Tensor, ...]:
    logp, old, rollout, adv = (torch.zeros(2, 4) for _ in range(4))
    rollout.fill_(NAN)
    mask = torch.zeros(2, 4)
    slots = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]
    for (b, t), (delta, o, log_q, a) in zip(slots, TOKENS, strict=True):
        old[b, t], logp[b, t], adv[b, t], mask[b, t] = o, o + delta, a, 1.0
        if log_q is not None:
            rollout[b, t] = o - log_q
    logp[1, 2], old[1, 2], rollout[1, 2], adv[1, 2] = 5.0, -9.0, 3.0, 7.0  # masked out
    return logp.requires_grad_(), old, rollout, adv, mask


def test_token_mean_ignores_masked_tokens() -> None:
    assert token_mean(T([[1.0, 2.0, 9.0]]), T([[1, 1, 0]])).item() == pytest.approx(1.5)
    assert token_mean(T([[5.0]]), T([[0]])).item() == 0.0


def test_seq_mean_token_mean_averages_each_sample_first() -> None:
    values = T([[1.0, 3.0, 0.0], [10.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # the third has no token
    assert seq_mean_token_mean(values, mask).item() == pytest.approx((2.0 + 10.0) / 2)
    assert token_mean(values, mask).item() == pytest.approx(14.0 / 3)
    assert (agg_units(mask, "token_mean"), agg_units(mask, "seq_mean_token_mean")) == (3, 2)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(values, mask, "sum")  # type: ignore[arg-type]


def test_advantages() -> None:
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert rl_advantages(T([1.0, -1.0]), mask).tolist() == [[1, 1, 0], [-1, 0, 0]]
    teacher, old = T([[-0.5, -1.0, -2.0]]), T([[-1.0, -1.0, -1.0]])
    assert opd_advantages(teacher, old, mask[:1]).tolist() == [[0.5, 0.0, 0.0]]
    comb = combine_advantages(teacher, old, T([1.0]), mask[:1], w_opd=2.0, w_rl=0.5)
    assert comb.tolist() == [[1.5, 0.5, 0.0]]  # 2*0.5 + 0.5*1, 2*0 + 0.5*1, masked


def test_sample_advantages_use_the_trainers_old_and_only_real_teachers() -> None:
    mask = T([[1.0, 1.0], [1.0, 1.0]])
    old = T([[-1.0, -2.0], [-1.0, -1.0]])
    teacher = T([[-0.5, -2.5], [0.0, 0.0]])  # sample 1 has no teacher: zeros, not a signal
    has_teacher = T([True, False])
    rewards = T([0.0, 1.0])
    opd = sample_advantages("opd", rewards, teacher, has_teacher, old, mask)
    assert opd.tolist() == [[0.5, -0.5], [0.0, 0.0]]  # never -old for the teacherless sample
    comb = sample_advantages("combine", rewards, teacher, has_teacher, old, mask, 2.0, 0.5)
    assert comb.tolist() == [[1.0, -1.0], [0.5, 0.5]]
    rl = sample_advantages("rl", rewards, teacher, has_teacher, old, mask)
    assert rl.tolist() == [[0.0, 0.0], [1.0, 1.0]]


def test_teacher_minus_old_is_limited_to_the_clip_in_opd_and_combine() -> None:
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = T([[-1.0, -9.0, -0.5], [-2.0, -2.0, -2.0]])
    teacher = T([[-0.5, -0.5, -8.5], [-12.0, -1.0, 0.0]])  # gaps 0.5, 8.5, -8; -10, 1, (2)
    has_teacher, rewards = T([True, True]), T([1.0, -1.0])
    opd = sample_advantages("opd", rewards, teacher, has_teacher, old, mask, clip=2.0)
    assert opd.tolist() == [[0.5, 2.0, -2.0], [-2.0, 1.0, 0.0]]
    comb = sample_advantages("combine", rewards, teacher, has_teacher, old, mask, 1.0, 0.5, 2.0)
    assert comb.tolist() == [[1.0, 2.5, -1.5], [-2.5, 0.5, 0.0]]
    unclipped = sample_advantages("opd", rewards, teacher, has_teacher, old, mask)
    assert unclipped.tolist() == [[0.5, 8.5, -8.0], [-10.0, 1.0, 0.0]]


def test_a_centred_teacher_gap_is_relative_to_its_mean_over_the_taught_tokens() -> None:
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    old = T([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    teacher = T([[-2.0, -3.0, 9.0], [-1.0, -4.0, -2.0]])  # gaps -1, -2, (10); 0, -3, -1
    has_teacher = T([True, False])  # sample 1's gaps are no signal: not in the mean
    rewards = T([0.0, 1.0])
    opd = sample_advantages("opd", rewards, teacher, has_teacher, old, mask, centre=True)
    assert opd.tolist() == [[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]  # mean -1.5 over 2 tokens
    both = sample_advantages(
        "opd", rewards, teacher, T([True, True]), old, mask, clip=1.0, centre=True
    )
    # mean of -1, -2, 0, -3, -1 is -1.4: 0.4, -0.6, (masked), 1.4 -> 1, -1.6 -> -1, 0.4
    assert both.flatten().tolist() == pytest.approx([0.4, -0.6, 0.0, 1.0, -1.0, 0.4])
    comb = sample_advantages(
        "combine", rewards, teacher, has_teacher, old, mask, 1.0, 1.0, None, True
    )
    assert comb.tolist() == [[0.5, -0.5, 0.0], [1.0, 1.0, 1.0]]


def test_behaviour_weights_truncate_and_skip_missing_rollout_logprobs() -> None:
    old = T([[-1.0, -1.0, -1.0, -1.0]])
    rollout = T([[-1.0, -1.3, -0.7, NAN]])
    w = behaviour_weights(old, rollout, tis_clip=1.2).tolist()[0]
    assert w == pytest.approx([1.0, 1.2, math.exp(-0.3), 1.0])  # e^0.3 = 1.35 truncated at 1.2
    assert behaviour_weights(old, None, 2.0).tolist() == [[1.0] * 4]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_policy_loss_by_hand_with_mismatched_rollout_logprobs(agg: str) -> None:
    logp, old, rollout, adv, mask = tensors()
    stats = policy_loss(
        logp, old, rollout, adv, mask, eps=EPS, eps_high=EPS_HIGH, tis_clip=C, agg=agg
    )  # type: ignore[arg-type]
    rows = [by_hand(delta, log_q, a) for delta, _old, log_q, a in TOKENS]
    losses = [loss for loss, _w, _c in rows]
    expected = (
        sum(losses) / 6 if agg == "token_mean" else (sum(losses[:4]) / 4 + sum(losses[4:]) / 2) / 2
    )
    assert stats.pg_loss.item() == pytest.approx(expected, rel=1e-6)
    # the pieces by hand: e^0.1, e^-0.3 (advantage -1), 1.35 x 1.28 (clipped), 2 x 0.905
    assert losses == pytest.approx(
        [-1.0, -math.exp(0.1), math.exp(-0.3), -math.exp(0.3) * 1.28, 2 * math.exp(-0.1),
         -math.exp(0.2)]
    )  # fmt: skip
    assert [c for _l, _w, c in rows] == [False, False, False, True, False, False]


def test_policy_loss_statistics_by_hand() -> None:
    logp, old, rollout, adv, mask = tensors()
    stats = policy_loss(
        logp, old, rollout, adv, mask, eps=EPS, eps_high=EPS_HIGH, tis_clip=C, agg="token_mean"
    )
    assert stats.clipfrac.item() == pytest.approx(1 / 6)  # token 3
    assert stats.ppo_kl.item() == pytest.approx((-0.5 + 0.1 - 0.2) / 6)  # k1: old - logp
    log_qs = [0.0, 0.1, -0.3, 0.3, 1.3]  # the five tokens that have a rollout log-prob
    k3 = [math.exp(q) - 1 - q for q in log_qs]
    assert stats.rollout_kl.item() == pytest.approx(sum(k3) / 5, rel=1e-5)
    weights = [1.0, math.exp(0.1), math.exp(-0.3), math.exp(0.3), 2.0, 1.0]
    assert stats.tis_weight_mean.item() == pytest.approx(sum(weights) / 6, rel=1e-6)
    assert stats.tis_clipfrac.item() == pytest.approx(1 / 6)  # token 4: e^1.3 > 2


def test_policy_loss_gradient_is_linear_in_the_weight() -> None:
    """d loss / d logp = -w * r * A / n where r is inside the clip range, 0 where clipped.

    With the serving log-probs used as PPO's old as well, the first step's
    gradient would scale with w^2 instead.
    """
    logp, old, rollout, adv, mask = tensors()
    stats = policy_loss(
        logp, old, rollout, adv, mask, eps=EPS, eps_high=EPS_HIGH, tis_clip=C, agg="token_mean"
    )
    stats.pg_loss.backward()
    assert logp.grad is not None
    grads = logp.grad[mask.bool()].tolist()
    expected = []
    for delta, _old, log_q, a in TOKENS:
        _loss, w, clipped = by_hand(delta, log_q, a)
        expected.append(0.0 if clipped else -w * math.exp(delta) * a / 6)
    assert grads == pytest.approx(expected, rel=1e-5, abs=1e-9)
    assert logp.grad[1, 2].item() == 0.0  # masked


def test_without_rollout_logprobs_it_is_plain_ppo() -> None:
    logp = T([[-1.0, -2.0]], requires_grad=True)
    adv = T([[0.5, -1.5]])
    stats = policy_loss(
        logp,
        logp.detach(),
        None,
        adv,
        torch.ones(1, 2),
        eps=EPS,
        eps_high=EPS_HIGH,
        tis_clip=C,
        agg="token_mean",
    )
    assert stats.pg_loss.item() == pytest.approx(0.5)  # -(0.5 - 1.5) / 2
    assert (stats.rollout_kl.item(), stats.tis_weight_mean.item()) == (0.0, 1.0)
    stats.pg_loss.backward()
    assert logp.grad is not None and logp.grad.tolist() == [[-0.25, 0.75]]  # -A / n


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


def test_topk_distill_loss_gathers_the_student_at_the_teachers_ids() -> None:
    # Vocabulary of 4. Student logits log[0.1, 0.2, 0.3, 0.4]: probabilities exactly those.
    logits = torch.log(T([[[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]]]))
    ids = T([[[3, 1], [0, 2]]])  # position 0: the teacher's top-2 are ids 3 and 1
    teacher = torch.log(T([[[0.6, 0.3], [0.5, 0.1]]]))
    mask = T([[1.0, 0.0]])  # only position 0 counts
    got = topk_distill_loss(logits, ids, teacher, mask).item()
    student = [0.4, 0.2, 1 - 0.4 - 0.2]  # ids 3, 1, then the tail
    target = [0.6, 0.3, 1 - 0.6 - 0.3]
    expected = sum(p * math.log(p / q) for p, q in zip(student, target, strict=True))
    assert got == pytest.approx(expected, rel=1e-5)
    both = topk_distill_loss(logits, ids, teacher, torch.ones(1, 2)).item()
    second = 0.25 * math.log(0.25 / 0.5) + 0.25 * math.log(0.25 / 0.1)
    second += 0.5 * math.log(0.5 / 0.4)
    assert both == pytest.approx((expected + second) / 2, rel=1e-5)
