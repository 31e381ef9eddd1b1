"""The accept rule: which records of samples.scored become pending samples, and why not.

A record trains once: undecodable records are dead-lettered, sample_ids in
the ledger (or already pending) are duplicates, excluded samples take no
batch slot, and with ``stale_policy: drop`` samples more than
``max_staleness`` policy versions behind are dropped. Every skip is counted by
reason; the counts a checkpoint records cover only the records below its
offsets, so a restart that reads the rest again does not count them twice.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer

from pipeline.deadletters import DeadLetters
from pipeline.errors import EventDecodeError
from pipeline.events import Sample, decode_as
from pipeline.training.batch import TokenizedSample, tokenize_sample
from pipeline.training.config import TrainerConfig
from pipeline.training.metrics import TEACHER_MISALIGNED
from pipeline.training.outbox import Outbox

log = logging.getLogger(__name__)
LEDGER_SIZE = 1_000_000


class Ledger:
    """Bounded memory of trained sample_ids (the dedup window)."""

    def __init__(self, ids: list[str], size: int = LEDGER_SIZE) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict.fromkeys(ids[-size:])

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self._ids

    def add(self, sample_id: str) -> None:
        self._ids[sample_id] = None
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)

    def ids(self) -> list[str]:
        return list(self._ids)


@dataclass
class Pending:
    sample: TokenizedSample
    partition: int
    offset: int


class Intake:
    """Accepted samples waiting for a step, the ledger, and the skip counts."""

    def __init__(
        self,
        config: TrainerConfig,
        tokenizer: Any,
        dead_letters: DeadLetters,
        outbox: Outbox,
        ledger: list[str] | None = None,
        skipped: dict[str, int] | None = None,
    ) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.dead_letters, self.outbox = dead_letters, outbox
        self.ledger = Ledger(ledger or [])
        self.skipped: Counter[str] = Counter(skipped or {})  # all counted so far
        # (partition, offset, reason) of skips at or past the checkpoint's offsets
        self.skips_ahead: list[tuple[int, int, str]] = []
        self.pending: list[Pending] = []
        self.pending_ids: set[str] = set()

    def accept(self, rec: Any, out: KafkaProducer, policy_version: int) -> None:
        """Take one record: pending, or skipped with its reason (dead-lettered if undecodable)."""
        try:
            sample = decode_as(Sample, rec.value)
        except EventDecodeError as exc:
            self.skip(rec, "invalid")
            where = f"{rec.topic}/{rec.partition}/{rec.offset}"
            letter = self.dead_letters.encoded("train", str(exc), where, rec.value)
            self.outbox.send(out, self.dead_letters.topic, letter)
            return
        reason = self.skip_reason(sample, policy_version)
        if reason is not None:
            self.skip(rec, reason)
            return
        tok = tokenize_sample(
            sample, self.tokenizer, self.config.max_seq_len, self.config.group_advantage
        )
        if tok.teacher_misaligned:
            TEACHER_MISALIGNED.inc()
            log.warning("%s: teacher log-probs do not cover its response tokens", tok.sample_id)
        self.pending.append(Pending(tok, rec.partition, rec.offset))
        self.pending_ids.add(sample.sample_id)

    def skip_reason(self, sample: Sample, policy_version: int) -> str | None:
        """Why a decoded sample takes no batch slot (None: it trains)."""
        if sample.sample_id in self.ledger or sample.sample_id in self.pending_ids:
            return "duplicate"
        if sample.loss_mask == 0:
            return f"excluded:{sample.exclude_reason}"
        version = sample.policy_version
        stale = version is not None and policy_version - version > self.config.max_staleness
        if self.config.stale_policy == "drop" and stale:
            return "stale"
        return None

    def skip(self, rec: Any, reason: str) -> None:
        self.skipped[reason] += 1
        self.skips_ahead.append((rec.partition, rec.offset, reason))

    def skips_below(self, offsets: dict[int, int]) -> dict[str, int]:
        """The skip counts of the records below ``offsets`` (what a checkpoint at them covers)."""
        self.skips_ahead = [s for s in self.skips_ahead if s[1] >= offsets.get(s[0], 0)]
        return dict(self.skipped - Counter(reason for _p, _o, reason in self.skips_ahead))

    def held_offsets(self, positions: dict[int, int]) -> dict[int, int]:
        """Next offset per partition, held back to the oldest sample not trained yet."""
        offsets = dict(positions)
        for p in self.pending:
            offsets[p.partition] = min(offsets.get(p.partition, p.offset), p.offset)
        return offsets

    def batch_ready(self) -> bool:
        if self.config.max_tokens_per_batch:
            return sum(p.sample.length for p in self.pending) >= self.config.max_tokens_per_batch
        return len(self.pending) >= self.config.rollout_batch_size

    def batch_size(self) -> int:
        """Samples in the next step: rollout_batch_size, or as many as fit the token budget."""
        budget = self.config.max_tokens_per_batch
        if not budget:
            return self.config.rollout_batch_size
        used = 0
        for n, p in enumerate(self.pending):
            used += p.sample.length
            if used > budget:
                return max(1, n)
        return len(self.pending)

    def take_batch(self) -> list[TokenizedSample]:
        """The next step's samples, out of pending (into the ledger once trained)."""
        size = self.batch_size()
        batch, self.pending = self.pending[:size], self.pending[size:]
        self.pending_ids.difference_update(p.sample.sample_id for p in batch)
        return [p.sample for p in batch]

    def trained(self, samples: list[TokenizedSample]) -> None:
        for s in samples:
            self.ledger.add(s.sample_id)
