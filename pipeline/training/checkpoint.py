"""Checkpoint, then commit: how a step's progress becomes durable, in this order.

1. What the trainer produced for the records below the new offsets (dead
   letters, policy versions) is on the broker;
2. a DeepSpeed checkpoint holds the weights, the optimizer, the next offset of
   every partition and the ledger of trained sample_ids;
3. the sample_ids the step trained are appended to the ledger log;
4. the offsets are committed to the consumer group.

A crash anywhere resumes from the last checkpoint, whose offsets win over the
group's and whose ledger drops anything trained already. Older checkpoints
beyond ``keep_checkpoints`` are deleted after each save.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import KafkaError

from pipeline.backoff import RetryPolicy, retry
from pipeline.training.retention import prune_checkpoints

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    """What a checkpoint records besides the weights: where to resume, what was trained."""

    step: int = 0
    policy_version: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # "partition" -> next offset
    ledger: list[str] = field(default_factory=list)  # trained sample_ids, oldest first
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def positions(self) -> dict[int, int]:
        return {int(p): o for p, o in self.offsets.items()}


def step_tag(step: int) -> str:
    return f"step{step:08d}"


class Checkpoints:
    """The trainer's DeepSpeed checkpoints and its ledger log (rank 0 writes the log)."""

    def __init__(
        self,
        engine: Any,
        directory: Path,
        keep: int,
        ledger_log: Path | None = None,
        frozen: bool = True,
    ) -> None:
        self.engine = engine  # the DeepSpeed engine
        self.dir = directory
        self.keep = keep
        self.ledger_log = ledger_log
        self.frozen = frozen  # False: the frozen parameters are not saved (model_path has them)

    def load(self) -> TrainerState:
        """The state of the newest checkpoint (weights and optimizer loaded), else a fresh one."""
        if not (self.dir / "latest").exists():
            state = TrainerState()
        else:
            try:
                light = {} if self.frozen else {"load_module_strict": False}
                _path, client_state = self.engine.load_checkpoint(str(self.dir), **light)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"the checkpoint in {self.dir} does not fit the model (saved with another "
                    f"checkpoint_frozen or train_top_layers? this run has checkpoint_frozen "
                    f"{self.frozen}): {exc}"
                ) from exc
            state = TrainerState(**client_state["trainer_state"])
            log.info("resumed from checkpoint step %d, offsets %s", state.step, state.offsets)
        if self.ledger_log is not None:
            reconcile_ledger_log(self.ledger_log, state)
        return state

    def save(self, state: TrainerState | None, tag: str) -> None:
        """A checkpoint under ``tag``; ranks other than 0 save theirs with no state."""
        client_state = {"trainer_state": asdict(state)} if state is not None else {}
        light = {} if self.frozen else {"exclude_frozen_parameters": True}
        self.engine.save_checkpoint(str(self.dir), tag=tag, client_state=client_state, **light)

    def save_then_commit(
        self,
        state: TrainerState,
        deliver: Callable[[], bool],
        record: Callable[[], dict[int, int]],
        commit: Callable[[dict[int, int]], None],
        trained: list[str],
    ) -> bool:
        """Steps 1-4 above; False, with nothing saved or committed, when delivery was
        given up (a stop during a broker outage).

        ``record`` fills ``state`` (offsets, ledger, skip counts) and returns the offsets.
        """
        if not deliver():
            log.warning(
                "stopping before checkpoint %d; a restart resumes from the one before", state.step
            )
            return False
        offsets = record()
        self.save(state, step_tag(state.step))
        if self.ledger_log is not None and trained:
            append_ledger_log(self.ledger_log, state.step, trained)
        commit(offsets)
        prune_checkpoints(self.dir, self.keep)
        return True


def commit_waiting(
    consumer: KafkaConsumer,
    topic: str,
    offsets: dict[int, int],
    stop: Callable[[], bool],
    retry_policy: RetryPolicy,
) -> None:
    """Commit to the group, waiting out a broker that is down or restarting.

    The checkpoint already holds these offsets (they win on restart), so
    waiting is safe, and so is giving up when asked to stop.
    """
    request = {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
    try:  # short attempts: the broker may be back before kafka-python's 30 s are up
        retry(
            lambda _attempt: consumer.commit(request, timeout_ms=5000),
            retry_policy,
            (KafkaError,),
            when=lambda exc: bool(getattr(exc, "retriable", False)),
            on_retry=_log_retry,
            stop=stop,
        )
    except KafkaError as exc:
        if not (exc.retriable and stop()):
            raise
        log.warning("stopping uncommitted (%r): the checkpoint has them", exc)


def _log_retry(_attempt: int, error: BaseException, delay_s: float) -> None:
    log.warning("committing offsets failed (%r); retrying in %.1fs", error, delay_s)


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
