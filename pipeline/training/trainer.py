"""`turnstream train`'s step loop: samples into optimizer steps, exactly once per sample_id.

Rank 0 reads a :mod:`~pipeline.training.sources` source, takes records through
the accept rule (:mod:`~pipeline.training.intake`), and once a batch is ready
deals its samples to the ranks, trains, pushes weights every
``update_weights_interval`` steps, and makes the step durable with the
checkpoint-then-commit protocol (:mod:`~pipeline.training.checkpoint`).
Other ranks train on the shards rank 0 broadcasts and checkpoint when it does.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from kafka import KafkaProducer

from pipeline.broker.clients import producer
from pipeline.broker.reading import TopicRange
from pipeline.deadletters import DeadLetters
from pipeline.settings import Settings
from pipeline.training.batch import (
    TokenizedSample,
    alike,
    micro_batches,
    step_baseline,
    step_totals,
)
from pipeline.training.checkpoint import Checkpoints, TrainerState, step_tag
from pipeline.training.config import TrainerConfig
from pipeline.training.intake import Intake
from pipeline.training.metrics import SENTINELS, WEIGHT_PUSH_FAILURES, MetricsSink
from pipeline.training.outbox import Outbox
from pipeline.training.retention import prune_weight_versions
from pipeline.training.signals import Requests
from pipeline.training.sources import LiveSource, RangeSource
from pipeline.training.weights import (
    PolicyVersion,
    WeightPushError,
    WrongBase,
    push_to_servers,
    save_delta,
    save_weights,
    version_dir,
)

log = logging.getLogger(__name__)


class Trainer:
    """One trainer process; ``run`` until max_steps, a stop request, or the source's end."""

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
        dist = torch.distributed
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        lead = self.rank == 0
        self.checkpoints = Checkpoints(
            getattr(engine, "engine", None),
            Path(config.checkpoint_dir),
            config.keep_checkpoints,
            ledger_log if lead else None,
            frozen=config.checkpoint_frozen or config.train_top_layers is None,
        )
        self.state = self.checkpoints.load()
        if engine is not None:
            engine.steps = self.state.step
        group = settings.topic_prefix + config.group_id
        self.source: LiveSource | RangeSource = (
            RangeSource(settings, group, span, self.state.positions)
            if span is not None
            else LiveSource(settings, group, self.state.positions)
        )
        self.outbox = Outbox(
            config.broker_retry
        )  # dead letters and policy versions to deliver before a commit
        self.intake = Intake(
            config,
            tokenizer,
            DeadLetters(settings.topics),
            self.outbox,
            self.state.ledger,
            self.state.skipped,
        )
        self.requests = Requests()  # stop / drain flags, set by signal handlers
        self.sink = MetricsSink.of_rank(config, self.rank)
        self.push_token = uuid.uuid4().hex[:12]  # names this process's whole pushes (bases)
        self._delta_base: str | None = None  # the whole push deltas apply to; None: push whole
        self._last_push: dict[str, Any] = {}  # kind (full or delta) and bytes of the last push
        self._idle_since = time.perf_counter()

    def _stop(self) -> bool:
        return self.requests.stop

    def _done(self) -> bool:
        return self.config.max_steps is not None and self.state.step >= self.config.max_steps

    def run(self, until_end: bool = False, poll_ms: int = 500) -> TrainerState:
        """Train until max_steps, a stop request, or (``until_end``) the source's end.

        Rank 0 consumes and broadcasts each step's shards; other ranks follow.
        """
        if self.rank != 0:
            return self._follow()
        try:
            return self._lead(until_end, poll_ms)
        finally:
            self._broadcast({"kind": "stop"})
            self.sink.close()

    def _lead(self, until_end: bool, poll_ms: int) -> TrainerState:
        self.source.open()
        self._idle_since = time.perf_counter()
        if until_end:
            self.source.bound_to_current_end()
        out = producer(self.settings, self.settings.topics.deadletter.max_message_bytes)
        try:
            while not self.requests.stop and not self._done():
                if self.requests.drain and not self.source.bounded:
                    self.source.bound_to_current_end()  # what is there now
                    log.info("draining: training up to the current end of %s", self.source.topic)
                for rec in self.source.poll(poll_ms):
                    self.intake.accept(rec, out, self.state.policy_version)
                    self.source.passed(rec)
                if self._steps_ready(out):
                    continue
                if self.source.at_end():
                    self._finish(out)
                    break
        finally:
            out.flush()
            out.close()
            self.source.close()
        return self.state

    def _steps_ready(self, out: KafkaProducer) -> bool:
        """Train every full batch pending; True if there was one."""
        stepped = False
        while self.intake.batch_ready() and not self._done() and not self.requests.stop:
            self._step(out)
            stepped = True
        return stepped

    def _finish(self, out: KafkaProducer) -> None:
        """At the source's end: the last, partial batch, or a checkpoint of the skips."""
        if self.intake.pending:
            self._step(out)
        else:
            self._broadcast({"kind": "checkpoint", "tag": step_tag(self.state.step)})
            self._checkpoint_and_commit(out, [])

    def _broadcast(self, message: dict[str, Any]) -> dict[str, Any]:
        if self.world == 1:
            return message
        box = [message if self.rank == 0 else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[return-value]

    def _follow(self) -> TrainerState:
        """Ranks > 0: train on the shards rank 0 sends, checkpoint when it does."""
        while True:
            message = self._broadcast({})
            if message["kind"] == "stop":
                return self.state
            if message["kind"] == "step":
                mbs = self._micro_batches(message["shards"][self.rank])
                metrics = self.engine.train_step(
                    mbs, message["tokens"], message["samples"], message.get("update", True)
                )
                self.state.step = metrics.step
            self.checkpoints.save(None, message["tag"])

    def _micro_batches(self, shard: list[TokenizedSample]) -> list[Any]:
        pad = self.tokenizer.pad_token_id or 0
        c = self.config
        return micro_batches(shard, c.micro_batch_size, pad, c.length_bucketing)

    def _shards(self, samples: list[TokenizedSample]) -> list[list[TokenizedSample]]:
        """Deal samples to ranks by length; a rank short of samples gets a zero-token pad."""
        shards: list[list[TokenizedSample]] = [[] for _ in range(self.world)]
        for i, s in enumerate(sorted(samples, key=lambda s: s.length)):
            shards[i % self.world].append(s)
        for shard in shards:
            if not shard:
                prompt = samples[0].prompt_ids[:8] or [0]
                shard.append(TokenizedSample("__pad__", prompt, [], 0.0, None, None, None))
        return shards

    def _step(self, out: KafkaProducer) -> None:
        began = time.perf_counter()
        samples = self.intake.take_batch()
        tokens, count = step_totals(samples)
        c = self.config
        shards = self._shards(
            step_baseline(samples, c.step_baseline, c.alike_steps, c.baseline_group)
        )
        tag = step_tag(self.state.step + 1)
        skip = c.alike_steps == "skip" and c.mode == "rl" and c.step_baseline != "none"
        update = not (skip and alike(samples))
        message = {"kind": "step", "shards": shards, "tokens": tokens, "samples": count}
        self._broadcast({**message, "tag": tag, "update": update})
        metrics = self.engine.train_step(self._micro_batches(shards[0]), tokens, count, update)
        trained_at = time.perf_counter()
        if self.config.step_baseline != "none":  # report the scores, not their advantages
            scores = [s.reward for s in samples if s.response_ids]
            metrics = replace(metrics, reward_mean=sum(scores) / max(len(scores), 1))
        versions = [s.policy_version for s in samples if s.policy_version is not None]
        staleness = (
            sum(self.state.policy_version - v for v in versions) / len(versions)
            if versions
            else None
        )
        self.intake.trained(samples)
        self.state.step = metrics.step
        pushed = None
        interval = self.config.update_weights_interval
        if interval and metrics.step % interval == 0:
            pushed = self._push_weights(out, metrics.step, _sentinels(metrics))
        pushed_at = time.perf_counter()
        self._checkpoint_and_commit(out, [s.sample_id for s in samples])
        done = time.perf_counter()
        times = {
            "wait": began - self._idle_since,  # for the batch: serving and judging it
            "train": trained_at - began,
            "push": pushed_at - trained_at,
            "checkpoint": done - pushed_at,
        }
        self._idle_since = done
        self._log_metrics(metrics, pushed, staleness, times, update)

    def _checkpoint_and_commit(self, out: KafkaProducer, trained: list[str]) -> None:
        self.checkpoints.save_then_commit(
            self.state,
            deliver=lambda: self.outbox.deliver(out, self._stop),
            record=self._record_progress,
            commit=lambda offsets: self.source.commit(
                offsets, self._stop, self.config.broker_retry
            ),
            trained=trained,
        )

    def _record_progress(self) -> dict[int, int]:
        """Put the offsets to commit, the ledger and the skip counts below them in the state."""
        offsets = self.intake.held_offsets(self.source.positions)
        self.state.offsets = {str(p): o for p, o in offsets.items()}
        self.state.ledger = self.intake.ledger.ids()
        self.state.skipped = self.intake.skips_below(offsets)
        return offsets

    def _push_weights(
        self, out: KafkaProducer, step: int, sentinels: dict[str, float] | None = None
    ) -> PolicyVersion | None:
        """Save HF weights, have the policy servers load them, announce the version."""
        version = self.state.policy_version + 1
        weights_dir = Path(self.config.weights_dir)
        path = version_dir(weights_dir, version)
        try:
            path, self._last_push = self._save_and_push(weights_dir, version)
        except WeightPushError as exc:  # servers down or refusing: tried again next interval
            self._delta_base = None  # the next push is whole: a server may have missed this one
            WEIGHT_PUSH_FAILURES.labels("refused").inc()
            log.error("%s; the servers keep the weights they have, pushed again next time", exc)
            return None
        except Exception:  # a bug, not an outage: its traceback, and training goes on
            WEIGHT_PUSH_FAILURES.labels("error").inc()
            log.exception("weight push of %s failed unexpectedly", path)
            return None
        record = PolicyVersion(version, str(path), step, time.time(), sentinels, self._last_push)
        topic = self.settings.topics.policy_versions.name
        self.outbox.send(out, topic, record.encode(), key=b"policy")
        self.state.policy_version = version
        prune_weight_versions(weights_dir, self.config.keep_weight_versions, path)
        return record

    def _save_and_push(self, weights_dir: Path, version: int) -> tuple[Path, dict[str, Any]]:
        """A delta on the last whole push when the servers take one, else the whole
        checkpoint (which becomes the base of the next deltas); the directory pushed, and
        what was pushed (kind, bytes)."""
        module, urls = self.engine.engine.module, list(self.config.policy_urls)
        retry_policy = self.config.weight_push_retry
        if self._delta_base is not None:
            path, size = save_delta(module, weights_dir, version, self._delta_base)
            try:
                push_to_servers(urls, path, retry_policy)
                return path, {"kind": "delta", "bytes": size}
            except WrongBase as exc:  # a server restarted or missed the base: push it whole
                log.warning("%s; pushing the whole checkpoint instead", exc)
            shutil.rmtree(path)
        base = f"{self.push_token}/v{version:06d}"
        path = save_weights(module, self.tokenizer, weights_dir, version, base)
        answers = push_to_servers(urls, path, retry_policy)
        deltas = self.config.weight_push == "auto" and all(a.get("weight_deltas") for a in answers)
        self._delta_base = base if deltas and urls else None
        return path, {"kind": "full", "bytes": _dir_bytes(path)}

    def _log_metrics(
        self,
        metrics: Any,
        pushed: PolicyVersion | None,
        staleness: float | None,
        times: dict[str, float],
        updated: bool = True,
    ) -> None:
        """``updated`` False: the step changed no weight (alike_steps skip)."""
        row = {
            **asdict(metrics),
            "updated": updated,
            "mode": self.config.mode,
            "skipped": dict(self.intake.skipped),
            "policy_version": self.state.policy_version,
            "pushed": pushed is not None,
            "push": self._last_push if pushed is not None else None,
            "staleness": staleness,
            "time_s": {part: round(seconds, 3) for part, seconds in times.items()},
        }
        log.info(
            "step %d loss %.4f reward %.3f%s", metrics.step, metrics.loss, metrics.reward_mean,
            "" if updated else " (every score alike: no update)",
        )  # fmt: skip
        self.sink.record(row)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def _sentinels(metrics: Any) -> dict[str, float]:
    """The step's figures a version carries on policy.versions (see PolicyVersion)."""
    return {name: round(float(getattr(metrics, name)), 6) for name in SENTINELS}
