"""Scored samples into padded tensors, in micro-batches grouped by length.

Log-probs are aligned to next-token positions: position ``t`` of a ``[B, L-1]``
tensor is the log-prob of token ``t+1``. A sample's response tokens sit at
positions ``P .. P+R-1`` of its ids, so their log-probs are at ``P-1 .. P+R-2``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.events import Sample
from pipeline.turn_tokens import (
    align_rollout,
    chat_dicts,
    end_of_turn_id,
    prompt_token_ids,
    response_token_ids,
)

TopK = list[list[tuple[float, int]]]


@dataclass(frozen=True)
class TokenizedSample:
    sample_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    rollout_logprobs: list[float] | None  # the serving engine's; NaN where it reported none
    teacher_logprobs: list[float] | None
    policy_version: int | None
    teacher_topk: TopK | None = None  # per response token: the teacher's top-K (log-prob, id)
    teacher_misaligned: bool = False  # it had teacher log-probs that did not cover its tokens
    # teacher_logprobs is hinted - neutral (teacher_contrast): the OPD advantage itself
    teacher_is_gap: bool = False

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def sample_reward(sample: Sample, group_advantage: str = "none") -> float:
    """The reward a sample trains with: its score, or its advantage within its group.

    With a ``group_advantage`` method, a sample scored with its group
    (``group_scores``) gets ``group_advantages(group_scores, method)`` at its
    ``group_index``; a sample without a group keeps its score.
    """
    if group_advantage == "none" or sample.group_scores is None or sample.group_index is None:
        return sample.score
    from pipeline.rewards.group import group_advantages

    return group_advantages(sample.group_scores, group_advantage)[sample.group_index]  # type: ignore[arg-type]


def tokenize_sample(
    sample: Sample, tokenizer: Any, max_seq_len: int, group_advantage: str = "none"
) -> TokenizedSample:
    """A sample's ids and per-token values, aligned over its response tokens.

    The ids are :func:`~pipeline.turn_tokens.response_token_ids` (the serving
    engine's own when the sample carries them) after the prompt; rollout
    log-probs go through :func:`~pipeline.turn_tokens.align_rollout`; teacher
    log-probs that do not cover the response exactly are dropped (never padded)
    and the sample is marked ``teacher_misaligned``. Prompts longer than
    ``max_seq_len`` minus the response lose tokens on the left. The reward is
    :func:`sample_reward`.
    """
    messages = chat_dicts(sample.messages)
    prompt_ids = prompt_token_ids(tokenizer, messages, sample.tools, sample.prompt_ids)
    response_ids = response_token_ids(
        tokenizer, messages, sample.response, sample.tools, sample.response_ids
    )
    rollout = align_rollout(sample.response_logprobs, response_ids, end_of_turn_id(tokenizer))
    teacher, topk = teacher_signal(sample, len(response_ids), _vocab_size(tokenizer))
    teacher, is_gap = contrasted(teacher, sample.teacher_neutral_logprobs)
    misaligned = sample.teacher_logprobs is not None and teacher is None
    keep = max(1, max_seq_len - 1)
    response_ids = response_ids[:keep]
    room = max(1, max_seq_len - len(response_ids))
    return TokenizedSample(
        sample.sample_id,
        list(prompt_ids)[-room:],
        response_ids,
        sample_reward(sample, group_advantage),
        rollout[:keep] if rollout is not None else None,
        teacher[:keep] if teacher is not None else None,
        sample.policy_version,
        topk[:keep] if topk is not None else None,
        misaligned,
        is_gap,
    )


def contrasted(
    teacher: list[float] | None, neutral: list[float] | None
) -> tuple[list[float] | None, bool]:
    """(hinted - neutral, True) when the sample has neutral log-probs for the same tokens;
    (teacher, False) without them; (None, False) when they cover other tokens (no signal)."""
    if teacher is None or neutral is None:
        return teacher, False
    if len(neutral) != len(teacher):
        return None, False
    return [t - n for t, n in zip(teacher, neutral, strict=True)], True


def teacher_signal(
    sample: Sample, n_response: int, vocab_size: int | None
) -> tuple[list[float] | None, TopK | None]:
    """The sample's teacher log-probs (and top-K) if they cover its ``n_response`` tokens.

    Anything else (another length, top-K rows of another count or width, ids
    outside the policy's vocabulary) is no teacher signal: (None, None).
    """
    teacher, topk = sample.teacher_logprobs, sample.teacher_top_logprobs
    if teacher is None or len(teacher) != n_response:
        return None, None
    if topk is not None:
        widths = {len(row) for row in topk}
        ids_ok = vocab_size is None or all(0 <= i < vocab_size for row in topk for _lp, i in row)
        if len(topk) != n_response or len(widths) > 1 or 0 in widths or not ids_ok:
            return None, None
    return list(teacher), ([list(row) for row in topk] if topk is not None else None)


def _vocab_size(tokenizer: Any) -> int | None:
    try:
        return len(tokenizer)
    except TypeError:
        return None


# tokens: a shorter prefix shared by a micro-batch's rows is run with each row (its own
# pass would cost more than the positions it saves)
SHARED_PREFIX_MIN = 8


@dataclass
class MicroBatch:
    sample_ids: list[str]
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    response_mask: torch.Tensor  # [B, L-1] float: 1 at response-token log-prob positions
    rollout_logprobs: torch.Tensor  # [B, L-1], NaN where unknown
    teacher_logprobs: torch.Tensor  # [B, L-1], 0 where unknown
    has_teacher: torch.Tensor  # [B] bool
    rewards: torch.Tensor  # [B]
    teacher_topk_ids: torch.Tensor | None = None  # [B, L-1, K] long
    teacher_topk_logprobs: torch.Tensor | None = None  # [B, L-1, K]
    has_teacher_topk: torch.Tensor | None = None  # [B] bool
    teacher_is_gap: torch.Tensor | None = None  # [B] bool: teacher_logprobs is hinted - neutral

    def teacher_for(self, old: torch.Tensor) -> torch.Tensor:
        """The teacher log-probs to take ``old`` from: where a row holds hinted - neutral,
        that plus ``old``, so teacher - old is the hint's own effect."""
        if self.teacher_is_gap is None or not bool(self.teacher_is_gap.any()):
            return self.teacher_logprobs
        rows = self.teacher_is_gap[:, None]
        return torch.where(rows, self.teacher_logprobs + old.detach(), self.teacher_logprobs)

    @property
    def tokens(self) -> int:
        return int(self.response_mask.sum().item())

    @functools.cached_property
    def response_from(self) -> int:
        """The first log-prob position with a response token in any row (0 when none): every
        position before it is prompt, which no loss reads, so no output head runs there."""
        columns = self.response_mask.sum(0).nonzero()
        return int(columns[0]) if len(columns) else 0

    @functools.cached_property
    def shared_prefix(self) -> int:
        """How many first tokens every row has alike, all before the first response
        position, when :data:`SHARED_PREFIX_MIN` or more (else 0): the trainer's top-layer
        passes run them once for the micro-batch (a chat template's system prompt, 24 of
        the ~60 tokens of a learn sample)."""
        ids = self.input_ids
        if ids.shape[0] < 2:
            return 0
        alike = (ids == ids[:1]).all(dim=0).long()
        n = int(alike.cumprod(0).sum())
        shortest = int(self.attention_mask.sum(-1).min())
        n = min(n, self.response_from, shortest - 1)
        return n if n >= SHARED_PREFIX_MIN else 0

    @property
    def samples(self) -> int:
        """Samples with at least one response token (what a per-sample mean counts)."""
        return int((self.response_mask.sum(-1) > 0).sum().item())


def collate(samples: Sequence[TokenizedSample], pad_id: int) -> MicroBatch:
    width = max(s.length for s in samples)
    b = len(samples)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    response_mask = torch.zeros((b, width - 1))
    rollout = torch.full((b, width - 1), math.nan)
    teacher = torch.zeros((b, width - 1))
    for i, s in enumerate(samples):
        ids = s.prompt_ids + s.response_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        start, end = len(s.prompt_ids) - 1, len(ids) - 1
        response_mask[i, start:end] = 1.0
        if s.rollout_logprobs is not None:
            rollout[i, start:end] = torch.tensor(s.rollout_logprobs)
        if s.teacher_logprobs is not None:
            teacher[i, start:end] = torch.tensor(s.teacher_logprobs)
    topk_ids, topk_logprobs, has_topk = collate_topk(samples, width - 1)
    return MicroBatch(
        [s.sample_id for s in samples],
        input_ids,
        attention,
        response_mask,
        rollout,
        teacher,
        torch.tensor([s.teacher_logprobs is not None for s in samples]),
        torch.tensor([s.reward for s in samples], dtype=torch.float32),
        topk_ids,
        topk_logprobs,
        has_topk,
        torch.tensor([s.teacher_is_gap for s in samples]),
    )


def collate_topk(
    samples: Sequence[TokenizedSample], positions: int
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The teacher's top-K ids and log-probs at each response position, ``[B, positions, K]``.

    K is the first sample's; a sample with another K has none here. Positions
    without a teacher row hold id 0 and log-prob 0 (masked out of the loss).
    """
    widths = [len(s.teacher_topk[0]) for s in samples if s.teacher_topk]
    if not widths:
        return None, None, None
    k = widths[0]
    ids = torch.zeros((len(samples), positions, k), dtype=torch.long)
    logprobs = torch.zeros((len(samples), positions, k))
    has = torch.zeros(len(samples), dtype=torch.bool)
    for i, s in enumerate(samples):
        if not s.teacher_topk or len(s.teacher_topk[0]) != k:
            continue
        start = len(s.prompt_ids) - 1
        rows = s.teacher_topk
        ids[i, start : start + len(rows)] = torch.tensor([[t for _lp, t in r] for r in rows])
        logprobs[i, start : start + len(rows)] = torch.tensor([[lp for lp, _t in r] for r in rows])
        has[i] = True
    return ids, logprobs, has


def step_baseline(
    samples: Sequence[TokenizedSample], method: str, alike: str = "no_signal", by: str = "step"
) -> list[TokenizedSample]:
    """The step's samples with each reward taken relative to the others' (``method`` as in
    :func:`~pipeline.rewards.group.group_advantages`); ``none`` leaves them as they are.

    ``by`` step: relative to the whole step; prompt: relative to the step's other samples
    with the same prompt tokens (GRPO's group, inside one step), and a prompt the step holds
    once relative to the whole step, as with step. A step whose samples all scored the same
    has no relative signal: ``alike`` no_signal makes every advantage 0 (the arithmetic of a
    baseline), raw keeps their scores as they are (a step of rejected answers pushes them
    down; see ``TrainerConfig.alike_steps``). Pads and samples without a response token
    train on nothing, so they neither take part in the baseline nor get one.
    """
    if method == "none":
        return list(samples)
    from pipeline.rewards.group import group_advantages

    counted = [i for i, s in enumerate(samples) if s.response_ids]
    scores = [samples[i].reward for i in counted]
    if alike == "raw" and len(set(scores)) == 1:  # skip: the trainer updates nothing
        return list(samples)
    advantage = dict(zip(counted, group_advantages(scores, method), strict=True))  # type: ignore[arg-type]
    if by == "prompt":
        groups: dict[tuple[int, ...], list[int]] = {}
        for i in counted:
            groups.setdefault(tuple(samples[i].prompt_ids), []).append(i)
        for members in (m for m in groups.values() if len(m) > 1):
            own = group_advantages([samples[i].reward for i in members], method)  # type: ignore[arg-type]
            advantage.update(zip(members, own, strict=True))
    out = list(samples)
    for i, a in advantage.items():
        out[i] = dataclasses.replace(samples[i], reward=a)
    return out


def alike(samples: Sequence[TokenizedSample]) -> bool:
    """Every sample with a response token scored the same (or none has one): a step
    baseline leaves such a step no signal."""
    return len({s.reward for s in samples if s.response_ids}) <= 1


def step_totals(samples: Sequence[TokenizedSample]) -> tuple[int, int]:
    """(response tokens, samples with a response token) of a step: what ``loss_agg`` divides by."""
    return sum(len(s.response_ids) for s in samples), sum(1 for s in samples if s.response_ids)


def micro_batches(
    samples: Sequence[TokenizedSample], size: int, pad_id: int, bucketing: bool = True
) -> list[MicroBatch]:
    """Split a step's samples into micro-batches; with bucketing, similar lengths together."""
    ordered = sorted(samples, key=lambda s: s.length) if bucketing else list(samples)
    return [collate(ordered[i : i + size], pad_id) for i in range(0, len(ordered), size)]


def padding_fraction(batches: Sequence[MicroBatch]) -> float:
    """Share of the token slots in the batches that are padding."""
    slots = sum(mb.attention_mask.numel() for mb in batches)
    real = sum(int(mb.attention_mask.sum().item()) for mb in batches)
    return 1.0 - real / slots if slots else 0.0
