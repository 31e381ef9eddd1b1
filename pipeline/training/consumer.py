"""`turnstream train`: samples.scored into optimizer steps, exactly once per sample_id.

Rank 0 reads every partition of samples.scored (manual assignment, so no
rebalance can move records under a step). Excluded samples are counted and
take no batch slot; undecodable records go to the dead-letter topic. After
each optimizer step the trainer writes a checkpoint that records the next
offset of every partition and the dedup ledger of trained sample_ids, and
only then commits those offsets to its consumer group. On restart the
checkpoint's offsets win; the ledger drops anything trained already. Rank 0
deletes checkpoints beyond the newest ``keep_checkpoints`` after each save, and
weight versions beyond the newest ``keep_weight_versions`` after each push.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError

from pipeline.broker.clients import consumer_config, producer
from pipeline.errors import BrokerError, EventDecodeError
from pipeline.events import Sample, decode_as
from pipeline.replay.ranges import TopicRange
from pipeline.scoring.stages import DeadLetters
from pipeline.settings import Settings
from pipeline.training.batch import TokenizedSample, micro_batches, tokenize_sample
from pipeline.training.config import TrainerConfig
from pipeline.training.metrics import MetricsSink
from pipeline.training.outbox import Outbox
from pipeline.training.retention import prune_checkpoints, prune_weight_versions
from pipeline.training.signals import Requests
from pipeline.training.weights import PolicyVersion, push_to_servers, save_weights

log = logging.getLogger(__name__)
LEDGER_SIZE = 1_000_000


@dataclass
class TrainerState:
    """What a checkpoint records besides the weights: where to resume, what was trained."""

    step: int = 0
    policy_version: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # "partition" -> next offset
    ledger: list[str] = field(default_factory=list)  # trained sample_ids, oldest first
    skipped: dict[str, int] = field(default_factory=dict)


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


def append_ledger_log(path: Path, step: int, sample_ids: list[str]) -> None:
    """Record, after the checkpoint that holds them, the sample_ids a step trained."""
    with open(path, "a") as fh:
        fh.writelines(f"{step}\t{sid}\n" for sid in sample_ids)
        fh.flush()
        os.fsync(fh.fileno())


def reconcile_ledger_log(path: Path, state: TrainerState) -> None:
    """Make the log agree with the checkpoint resumed from.

    Steps after the checkpoint were lost with the process (their samples will be
    trained again); ids the checkpoint holds but the log lacks (a crash between
    the two writes) are added.
    """
    lines = path.read_text().splitlines() if path.exists() else []
    kept = [line for line in lines if int(line.split("\t", 1)[0]) <= state.step]
    logged = {line.split("\t", 1)[1] for line in kept}
    missing = [f"{state.step}\t{sid}" for sid in state.ledger if sid not in logged]
    path.write_text("".join(f"{line}\n" for line in kept + missing))


@dataclass
class Pending:
    sample: TokenizedSample
    partition: int
    offset: int


class Trainer:
    """One trainer process (rank 0 consumes); ``run`` until max_steps or stopped."""

    def __init__(
        self,
        settings: Settings,
        config: TrainerConfig,
        engine: Any,
        tokenizer: Any,
        ledger_log: Path | None = None,
        span: TopicRange | None = None,
    ) -> None:
        self.settings, self.config = settings, config
        self.engine, self.tokenizer = engine, tokenizer
        # Offline: exactly ``span`` (a range of any samples topic), partition after
        # partition in offset order, so the same range and seed give the same batches.
        self.span = span
        self.topic = span.topic if span else settings.topics.samples_scored.name
        self.group = settings.topic_prefix + config.group_id
        self.ckpt_dir = Path(config.checkpoint_dir)
        self.state = self._load_checkpoint()
        self.ledger = Ledger(self.state.ledger)
        self.skipped: Counter[str] = Counter(self.state.skipped)  # all counted so far
        # (partition, offset, reason) of skipped records at or past the checkpoint's
        # offsets: a restart reads them again, so the checkpoint must not count them
        self.skips_ahead: list[tuple[int, int, str]] = []
        self.pending: list[Pending] = []
        self.pending_ids: set[str] = set()
        self.outbox = Outbox()  # dead letters and policy versions to deliver before a commit
        self.dead_letters = DeadLetters(settings.topics)
        self.positions: dict[int, int] = {int(p): o for p, o in self.state.offsets.items()}
        dist = torch.distributed
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.ledger_log = ledger_log if self.rank == 0 else None
        if self.ledger_log is not None:
            reconcile_ledger_log(self.ledger_log, self.state)
        self.requests = Requests()  # stop / drain flags, set by signal handlers
        self.sink = MetricsSink(
            config.metrics_jsonl if self.rank == 0 else None,
            config.metrics_port if self.rank == 0 else 0,
            config.tensorboard_dir if self.rank == 0 else None,
            host=config.metrics_host,
        )

    def _load_checkpoint(self) -> TrainerState:
        latest = self.ckpt_dir / "latest"
        if not latest.exists():
            return TrainerState()
        _path, client_state = self.engine.engine.load_checkpoint(str(self.ckpt_dir))
        state = TrainerState(**client_state["trainer_state"])
        self.engine.steps = state.step
        log.info("resumed from checkpoint step %d, offsets %s", state.step, state.offsets)
        return state

    def _consumer(self) -> tuple[KafkaConsumer, list[TopicPartition]]:
        consumer = KafkaConsumer(
            **consumer_config(
                self.settings,
                self.group,
                max_partition_fetch_bytes=self.settings.topics.samples_scored.max_message_bytes,
                fetch_max_bytes=self.settings.topics.samples_scored.max_message_bytes * 4,
            )
        )
        parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            raise BrokerError(f"topic {self.topic} does not exist; run `turnstream topics apply`")
        if self.span is not None:
            parts = {p for p, (start, end) in self.span.spans.items() if end > start}
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:
            if tp.partition in self.positions:
                consumer.seek(tp, self.positions[tp.partition])
            elif self.span is not None:
                consumer.seek(tp, self.span.spans[tp.partition][0])
            else:
                committed = consumer.committed(tp)
                if committed is not None:
                    consumer.seek(tp, committed)
                else:
                    consumer.seek_to_beginning(tp)
        return consumer, tps

    def _accept(self, rec: Any, out: KafkaProducer) -> None:
        try:
            sample = decode_as(Sample, rec.value)
        except EventDecodeError as exc:
            self._skip(rec, "invalid")
            letter = self.dead_letters(
                "train", str(exc), f"{rec.topic}/{rec.partition}/{rec.offset}", rec.value
            )
            self.outbox.send(out, letter.topic, letter.value)
            return
        if sample.sample_id in self.ledger or sample.sample_id in self.pending_ids:
            self._skip(rec, "duplicate")
        elif sample.loss_mask == 0:
            self._skip(rec, f"excluded:{sample.exclude_reason}")
        elif (
            self.config.stale_policy == "drop"
            and sample.policy_version is not None
            and self.state.policy_version - sample.policy_version > self.config.max_staleness
        ):
            self._skip(rec, "stale")
        else:
            tok = tokenize_sample(
                sample, self.tokenizer, self.config.max_seq_len, self.config.group_advantage
            )
            self.pending.append(Pending(tok, rec.partition, rec.offset))
            self.pending_ids.add(sample.sample_id)

    def _skip(self, rec: Any, reason: str) -> None:
        self.skipped[reason] += 1
        self.skips_ahead.append((rec.partition, rec.offset, reason))

    def _skips_below(self, offsets: dict[int, int]) -> dict[str, int]:
        """The skip counts of the records below ``offsets`` (what a checkpoint at them covers)."""
        self.skips_ahead = [s for s in self.skips_ahead if s[1] >= offsets.get(s[0], 0)]
        return dict(self.skipped - Counter(reason for _p, _o, reason in self.skips_ahead))

    def _done(self) -> bool:
        return self.config.max_steps is not None and self.state.step >= self.config.max_steps

    def _batch_ready(self) -> bool:
        if self.config.max_tokens_per_batch:
            return sum(p.sample.length for p in self.pending) >= self.config.max_tokens_per_batch
        return len(self.pending) >= self.config.rollout_batch_size

    def run(self, until_end: bool = False, poll_ms: int = 500) -> TrainerState:
        """Train until max_steps, a stop request, or (``until_end``) the topic's end.

        Rank 0 consumes and broadcasts each step's shards; other ranks follow.
        """
        if self.rank != 0:
            return self._follow()
        try:
            return self._lead(until_end, poll_ms)
        finally:
            self._broadcast({"kind": "stop"})

    def _broadcast(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.world == 1:
            return message
        box = [message if self.rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    def _follow(self) -> TrainerState:
        """Ranks > 0: train on the shards rank 0 sends, checkpoint when it does."""
        pad = self.tokenizer.pad_token_id or 0
        while True:
            message = self._broadcast({})
            if message["kind"] == "stop":
                return self.state
            if message["kind"] == "step":
                mbs = micro_batches(
                    message["shards"][self.rank],
                    self.config.micro_batch_size,
                    pad,
                    self.config.length_bucketing,
                )
                self.state.step = self.engine.train_step(mbs, message["total"]).step
            self.engine.engine.save_checkpoint(
                str(self.ckpt_dir), tag=message["tag"], client_state={}
            )

    def _shards(self, samples: list[TokenizedSample]) -> list[list[TokenizedSample]]:
        """Deal samples to ranks by length; a rank short of samples gets a zero-token pad."""
        shards: list[list[TokenizedSample]] = [[] for _ in range(self.world)]
        for i, s in enumerate(sorted(samples, key=lambda s: s.length)):
            shards[i % self.world].append(s)
        for shard in shards:
            if not shard:
                first = samples[0]
                shard.append(
                    TokenizedSample(
                        "__pad__", first.prompt_ids[:8] or [0], [], 0.0, None, None, None
                    )
                )
        return shards

    def _lead(self, until_end: bool, poll_ms: int) -> TrainerState:
        consumer, tps = self._consumer()
        out = producer(self.settings, self.settings.topics.deadletter.max_message_bytes)
        ends = consumer.end_offsets(tps) if until_end else {}
        if self.span is not None:
            until_end = True
            ends = {tp: self.span.spans[tp.partition][1] for tp in tps}
        try:
            while not self.requests.stop:
                if self._done():
                    break
                if self.requests.drain and not until_end:
                    until_end, ends = True, consumer.end_offsets(tps)  # what is there now
                    log.info("draining: training up to the current end of samples.scored")
                if self.span is not None:
                    self._one_partition_at_a_time(consumer, tps, ends)
                for tp, records in consumer.poll(timeout_ms=poll_ms).items():
                    for rec in records:
                        if self.span is not None and rec.offset >= ends[tp]:
                            break  # past the range
                        self._accept(rec, out)
                        self.positions[tp.partition] = rec.offset + 1
                if self.span is not None:  # offsets without records (deleted, compacted)
                    for tp in tps:
                        if consumer.position(tp) >= ends[tp]:
                            self.positions[tp.partition] = max(
                                self.positions.get(tp.partition, 0), ends[tp]
                            )
                stepped = False
                while self._batch_ready() and not self._done() and not self.requests.stop:
                    self._step(consumer, out, tps)
                    stepped = True
                if stepped:
                    continue
                if until_end and all(self._position(consumer, tp) >= ends[tp] for tp in tps):
                    if self.pending:
                        self._step(consumer, out, tps)  # the last, partial batch
                    else:
                        self._broadcast({"kind": "checkpoint", "tag": f"step{self.state.step:08d}"})
                        self._checkpoint_and_commit(consumer, out, tps)
                    break
        finally:
            out.flush()
            out.close()
            consumer.close()
        return self.state

    def _position(self, consumer: KafkaConsumer, tp: TopicPartition) -> int:
        """Where this partition stands: the next offset to accept (the fetch position
        can run past a range's end)."""
        if self.span is not None:
            return self.positions.get(tp.partition, self.span.spans[tp.partition][0])
        return int(consumer.position(tp))

    def _one_partition_at_a_time(
        self, consumer: KafkaConsumer, tps: list[TopicPartition], ends: dict[TopicPartition, int]
    ) -> None:
        """Fetch only the first partition of the range that is not done yet."""
        current = next((tp for tp in tps if self._position(consumer, tp) < ends[tp]), None)
        consumer.pause(*[tp for tp in tps if tp != current])
        if current is not None:
            consumer.resume(current)

    def _step(self, consumer: KafkaConsumer, out: KafkaProducer, tps: list[TopicPartition]) -> None:
        size = self._batch_size()
        batch, self.pending = self.pending[:size], self.pending[size:]
        self.pending_ids.difference_update(p.sample.sample_id for p in batch)
        samples = [p.sample for p in batch]
        shards = self._shards(samples)
        total = sum(len(s.response_ids) for s in samples)
        self._broadcast(
            {
                "kind": "step",
                "shards": shards,
                "total": total,
                "tag": f"step{self.state.step + 1:08d}",
            }
        )
        mbs = micro_batches(
            shards[0],
            self.config.micro_batch_size,
            self.tokenizer.pad_token_id or 0,
            self.config.length_bucketing,
        )
        metrics = self.engine.train_step(mbs, total)
        versions = [s.policy_version for s in samples if s.policy_version is not None]
        staleness = (
            sum(self.state.policy_version - v for v in versions) / len(versions)
            if versions
            else None
        )
        for p in batch:
            self.ledger.add(p.sample.sample_id)
        self.state.step = metrics.step
        pushed = None
        if (
            self.config.update_weights_interval
            and metrics.step % self.config.update_weights_interval == 0
        ):
            pushed = self._push_weights(out, metrics.step)
        self._checkpoint_and_commit(consumer, out, tps, [p.sample.sample_id for p in batch])
        self._log_metrics(metrics, pushed, staleness)

    def _commit_offsets(self) -> dict[int, int]:
        """Next offset per partition, held back to the oldest sample not trained yet."""
        offsets = dict(self.positions)
        for p in self.pending:
            offsets[p.partition] = min(offsets.get(p.partition, p.offset), p.offset)
        return offsets

    def _batch_size(self) -> int:
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

    def _checkpoint_and_commit(
        self,
        consumer: KafkaConsumer,
        out: KafkaProducer,
        tps: list[TopicPartition],
        trained: list[str] | None = None,
    ) -> None:
        # Dead letters and policy versions of the records below are delivered first.
        if not self.outbox.deliver(out, lambda: self.requests.stop):
            log.warning(
                "stopping before checkpoint %d; a restart resumes from the one before",
                self.state.step,
            )
            return
        offsets = self._commit_offsets()
        self.state.offsets = {str(p): o for p, o in offsets.items()}
        self.state.ledger = self.ledger.ids()
        self.state.skipped = self._skips_below(offsets)
        self.engine.engine.save_checkpoint(
            str(self.ckpt_dir),
            tag=f"step{self.state.step:08d}",
            client_state={"trainer_state": asdict(self.state)},
        )
        if self.ledger_log and trained:
            append_ledger_log(self.ledger_log, self.state.step, trained)
        self._commit(consumer, offsets)
        prune_checkpoints(self.ckpt_dir, self.config.keep_checkpoints)

    def _commit(self, consumer: KafkaConsumer, offsets: dict[int, int]) -> None:
        """Commit to the group, waiting out a broker that is down or restarting.

        The checkpoint already holds these offsets (they win on restart), so
        waiting is safe, and so is giving up when asked to stop.
        """
        request = {
            TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()
        }
        delay = 0.5
        while True:
            try:  # a short attempt: the broker may be back before kafka-python's 30 s are up
                consumer.commit(request, timeout_ms=5000)
                return
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                if self.requests.stop:
                    log.warning("stopping uncommitted (%r): the checkpoint has them", exc)
                    return
                log.warning("committing offsets failed (%r); retrying in %.1fs", exc, delay)
            time.sleep(delay)
            delay = min(2 * delay, 5.0)

    def _push_weights(self, out: KafkaProducer, step: int) -> PolicyVersion | None:
        version = self.state.policy_version + 1
        path = save_weights(
            self.engine.engine.module, self.tokenizer, Path(self.config.weights_dir), version
        )
        try:
            push_to_servers(list(self.config.policy_urls), path)
        except Exception as exc:  # reported, and tried again at the next interval
            self.skipped["weight_push_failed"] += 1
            log.error("%s", exc)
            return None
        record = PolicyVersion(version, str(path), step, time.time())
        self.outbox.send(
            out, self.settings.topics.policy_versions.name, record.encode(), key=b"policy"
        )
        self.state.policy_version = version
        prune_weight_versions(Path(self.config.weights_dir), self.config.keep_weight_versions, path)
        return record

    def _log_metrics(
        self, metrics: Any, pushed: PolicyVersion | None, staleness: float | None
    ) -> None:
        row = {
            **asdict(metrics),
            "skipped": dict(self.skipped),
            "policy_version": self.state.policy_version,
            "pushed": pushed is not None,
            "staleness": staleness,
        }
        log.info("step %d loss %.4f reward %.3f", metrics.step, metrics.loss, metrics.reward_mean)
        self.sink.record(row)
