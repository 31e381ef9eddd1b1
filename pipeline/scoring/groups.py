"""Group rewards in the scoring stage: turns that share a ``group_id`` are scored together.

Members meet on one worker because the pairing stage keys ``turns.paired`` by
the group's id. The judging agent hands each member to :class:`GroupScorer`,
which holds it until the group is complete (``group_size`` on the turn, else
the ``size`` of the rewards file) or ``timeout_s`` after its first member,
then runs the group processor once over the members present and answers each
member with its own sample. The sample records the scores of the whole group
(``group_scores``, ``group_index``) so the trainer can take advantages relative
to the group whatever batch the sample lands in.

Nothing is buffered outside Kafka: a member waits in the judging agent's
ordered window, unacknowledged, so a crashed worker's successor reads it again.
A group that waits holds the records behind it on its partition (up to the
window), which is why ``size`` may not exceed ``TURNSTREAM_SCORING_WINDOW``
and why ``timeout_s`` should be short. A group processor's FAILED fails every
member into ``samples.retry``; ``turnstream retry`` re-queues them and they meet
again. A member re-read after a restart joins its group again, once.

A grouped turn is scored by the group processor whether or not it has a next
state: group rewards compare outputs with each other and with the ground truth.

An output is one turn, or one rollout: the turns of a rollout attempt (from
``turnstream rollout run``, whose group size counts rollouts) are one output of
their group, complete once its final turn is here (the pairing stage sends a
rollout's turns together, the final last). The group processor sees each
rollout once, as its final turn's input (the whole rollout's messages and the
task's ground truth), and every turn of the rollout takes the rollout's score
and place in the group. A group of N rollouts of T turns waits with N × T
records in the window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.events import JudgeIdentity, Paired, Sample
from pipeline.judge.client import JudgeUnavailable
from pipeline.rewards import metrics
from pipeline.rewards.group import score_group
from pipeline.rewards.grouping import GroupPlan
from pipeline.rewards.protocols import GroupRewardProcessor, close_processor
from pipeline.rewards.types import RewardOutput, reward_input_from_paired
from pipeline.scoring.samples import build_sample
from pipeline.scoring.scorers import ScorerKind

log = logging.getLogger(__name__)


def unit_of(paired: Paired) -> str:
    """What one of a group's outputs is: a rollout (every turn of its session), else a turn."""
    return paired.turn.session_id if paired.turn.rollout else paired.sample_id


@dataclass
class _Group:
    key: str
    expected: int | None  # outputs: turns, or rollouts
    started: float
    members: dict[str, tuple[Paired, asyncio.Future[Sample]]] = field(default_factory=dict)
    units: dict[str, list[str]] = field(default_factory=dict)  # output -> its members' ids
    finished: set[str] = field(default_factory=set)  # outputs whose every member is here
    timer: asyncio.Task[None] | None = None

    def add(self, paired: Paired, future: asyncio.Future[Sample]) -> None:
        self.members[paired.sample_id] = (paired, future)
        unit = unit_of(paired)
        self.units.setdefault(unit, []).append(paired.sample_id)
        if not paired.turn.rollout or paired.rollout_final:  # a rollout ends with its final
            self.finished.add(unit)

    def outputs(self) -> list[tuple[Paired, list[tuple[Paired, asyncio.Future[Sample]]]]]:
        """Each output's scored pair (a rollout's final, else its latest) and its members."""
        out = []
        for ids in self.units.values():
            members = [self.members[i] for i in ids]
            final = next((p for p, _ in members if p.rollout_final), members[-1][0])
            out.append((final, members))
        return out


@dataclass
class GroupStats:
    """What the scorer did (the worker exports these as metrics)."""

    complete: int = 0
    timed_out: int = 0
    failed: int = 0
    rejoined: int = 0


class GroupScorer:
    """Collects the members of each group and scores every group once, together
    (a :class:`~pipeline.scoring.scorers.PairScorer`)."""

    kind: ScorerKind = "rewards"

    def __init__(
        self,
        processor: GroupRewardProcessor,
        identity: JudgeIdentity,
        name: str = "group",
        size: int | None = None,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.processor = processor
        self.identity = identity
        self.name = name
        self.size = size
        self.timeout_s = timeout_s
        self.clock = clock
        self.stats = GroupStats()
        self._open: dict[str, _Group] = {}
        self._scoring: set[asyncio.Task[None]] = set()

    @classmethod
    def of(cls, plan: GroupPlan, identity: JudgeIdentity) -> GroupScorer:
        """The scorer of a rewards file's ``group:``."""
        return cls(plan.processor, identity, plan.name, plan.size, plan.timeout_s)

    async def close(self) -> None:
        await close_processor(self.processor)

    @property
    def waiting(self) -> int:
        """Members held in groups not yet scored."""
        return sum(len(g.members) for g in self._open.values())

    async def score(self, paired: Paired) -> Sample:
        """The sample of one member, once its group has been scored.

        Raises JudgeUnavailable when the group processor FAILED (the member goes
        to ``samples.retry``).
        """
        key = paired.turn.group_id or paired.sample_id  # ungrouped: a group of one
        group = self._open.get(key)
        if group is None:
            expected = paired.turn.group_size or (self.size if paired.turn.group_id else 1)
            group = self._open[key] = _Group(key, expected, self.clock())
        held = group.members.get(paired.sample_id)
        if held is not None:  # read again (a restart, a retry): one place in the group
            self.stats.rejoined += 1
            return await asyncio.shield(held[1])
        future: asyncio.Future[Sample] = asyncio.get_running_loop().create_future()
        group.add(paired, future)
        metrics.GROUP_MEMBERS_WAITING.set(self.waiting)
        if group.expected is not None and len(group.finished) >= group.expected:
            self._close(group, complete=True)
        elif group.timer is None:
            group.timer = asyncio.ensure_future(self._expire(group))
        return await asyncio.shield(future)

    async def _expire(self, group: _Group) -> None:
        await asyncio.sleep(self.timeout_s)
        if self._open.get(group.key) is group:
            log.info(
                "group %r: %d of %s member(s) after %.0fs: scoring those",
                group.key,
                len(group.members),
                group.expected or "?",
                self.timeout_s,
            )
            self._close(group, complete=False)

    def _close(self, group: _Group, complete: bool) -> None:
        del self._open[group.key]
        if group.timer is not None and group.timer is not asyncio.current_task():
            group.timer.cancel()
        if complete:
            self.stats.complete += 1
        else:
            self.stats.timed_out += 1
        metrics.GROUPS.labels("complete" if complete else "timed_out").inc()
        metrics.GROUP_MEMBERS_WAITING.set(self.waiting)
        task = asyncio.ensure_future(self._score(group, complete))
        self._scoring.add(task)
        task.add_done_callback(self._scoring.discard)

    async def _score(self, group: _Group, complete: bool) -> None:
        units = group.outputs()
        members = list(group.members.values())
        started = self.clock()
        try:
            outputs = await score_group(
                self.processor, [reward_input_from_paired(p) for p, _ in units], group.key
            )
        except Exception as exc:  # a processor bug: each member fails with it, nothing hangs
            _fail(members, exc)
            return
        judge_s = self.clock() - started
        failed = next((o for o in outputs if not o.ok), None)
        if failed is not None:  # score_group fails every member together
            self.stats.failed += 1
            metrics.GROUPS.labels("failed").inc()
            _fail(members, JudgeUnavailable(f"group reward FAILED: {failed.error}"))
            return
        scores = [o.score for o in outputs]
        for index, ((_, of_unit), out) in enumerate(zip(units, outputs, strict=True)):
            for paired, future in of_unit:  # every turn of a rollout takes the rollout's score
                if not future.done():
                    future.set_result(
                        self._sample(paired, out, scores, index, len(units), complete, judge_s)
                    )

    def _sample(
        self,
        paired: Paired,
        out: RewardOutput,
        scores: list[float],
        index: int,
        members: int,
        complete: bool,
        judge_s: float,
    ) -> Sample:
        own = out.reward.reward_metrics if out.reward else {}
        metrics = {f"{self.name}/{k}": v for k, v in own.items()}
        metrics.update(
            {
                self.name: out.score,
                f"{self.name}/members": float(members),
                f"{self.name}/complete": float(complete),
            }
        )
        sample = build_sample(paired, self.identity, "rl", None, None, judge_s)
        return sample.model_copy(
            update={
                "score": out.score,
                "loss_mask": 1,
                "exclude_reason": None,
                "reward_metrics": metrics,
                "group_scores": scores,
                "group_index": index,
            }
        )


def _fail(members: list[tuple[Paired, asyncio.Future[Sample]]], exc: Exception) -> None:
    for _, future in members:
        if not future.done():
            future.set_exception(exc)
