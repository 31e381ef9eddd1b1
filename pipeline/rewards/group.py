"""Group rewards: outputs that share a group key (one prompt) are scored together.

The trainer's side is :func:`group_advantages`: each output's advantage
relative to its group (mean, mean/std as in GRPO, or leave-one-out as in
RLOO). Nothing here divides by the group's max: scale is the algorithm's
business, and a hard in-group normalisation would fight it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Literal, TypeVar

from pipeline.errors import RewardError
from pipeline.rewards.protocols import GroupRewardProcessor, run_group_processor
from pipeline.rewards.types import GroupRewardInput, RewardInput, RewardOutput, TaskStatus

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

AdvantageMethod = Literal["mean", "mean_std", "leave_one_out"]
ADVANTAGE_METHODS: tuple[AdvantageMethod, ...] = ("mean", "mean_std", "leave_one_out")


def group_by(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """Items by key, groups in order of first appearance, members in arrival order."""
    groups: dict[K, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def group_input(members: Sequence[RewardInput], group_key: str | None = None) -> GroupRewardInput:
    """One group input from the members' reward inputs; they must share the ground truth."""
    if not members:
        raise RewardError(f"group {group_key!r} has no members")
    truths = {repr(m.ground_truth) for m in members}
    if len(truths) > 1:
        raise RewardError(
            f"group {group_key!r}: members disagree on ground_truth ({', '.join(sorted(truths))}); "
            "a group is several outputs for the same prompt"
        )
    return GroupRewardInput(
        agent_outputs=[m.agent_output for m in members],
        ground_truth=members[0].ground_truth,
        request_metadata={"members": [m.request_metadata for m in members]},
        group_key=group_key,
    )


async def score_group(
    processor: GroupRewardProcessor, members: Sequence[RewardInput], group_key: str | None = None
) -> list[RewardOutput]:
    """Score a group together: one output per member, in order (a FAILED group fails each)."""
    result = await run_group_processor(processor, group_input(members, group_key))
    if result.status is TaskStatus.FAILED or result.reward is None:
        error = f"group {group_key!r}: {result.error}"
        return [RewardOutput.failed(error) for _ in members]
    return [RewardOutput(reward=r, status=TaskStatus.SUCCESS) for r in result.reward.rewards]


def group_advantages(
    scores: Sequence[float], method: AdvantageMethod = "mean_std", eps: float = 1e-6
) -> list[float]:
    """Group-relative advantages of one group's scores.

    - ``mean``: r_i - mean(r)
    - ``mean_std``: (r_i - mean(r)) / (std(r) + eps), std with N - 1 (as GRPO)
    - ``leave_one_out``: r_i - mean of the other N - 1 scores (RLOO)

    A group of one, or of equal scores, has advantage 0 everywhere: it carries
    no signal about which output was better.
    """
    if method not in ADVANTAGE_METHODS:
        raise ValueError(f"unknown advantage method {method!r}; use one of {ADVANTAGE_METHODS}")
    n = len(scores)
    if n == 0:
        return []
    if any(not math.isfinite(s) for s in scores):
        raise ValueError(f"group scores must be finite, got {list(scores)}")
    if n == 1:
        return [0.0]
    mean = math.fsum(scores) / n
    centred = [s - mean for s in scores]
    if method == "mean":
        return centred
    if method == "leave_one_out":
        return [c * n / (n - 1) for c in centred]
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]
