"""Which samples the trainer takes into a batch, why it skips the others, and the
checkpoint-then-commit protocol around each step."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from kafka.errors import MessageSizeTooLargeError

from pipeline.backoff import RetryPolicy
from pipeline.deadletters import DeadLetters
from pipeline.errors import BrokerError
from pipeline.events import JudgeIdentity, Response, Sample, encode
from pipeline.settings import Settings
from pipeline.training.checkpoint import TrainerState, commit_waiting, reconcile_ledger_log
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import StepMetrics
from pipeline.training.intake import Intake, Ledger
from pipeline.training.outbox import Outbox
from pipeline.training.trainer import Trainer
from tests.broker_doubles import FlakyConsumer, OutageProducer


def sample(i: int, version: int = 0, mask: int = 1) -> Sample:
    return Sample(
        sample_id=f"s:{i}",
        session_id="s",
        turn_index=i,
        messages=[],
        response=Response(content="x"),
        next_state=None,
        prompt_ids=[1, 2],
        response_ids=[3],
        score=1.0,
        votes=[1],
        judge_calls=1,
        exclude_reason=None if mask else "neutral_score",
        loss_mask=mask,
        mode="rl",
        policy_version=version,
        judge=JudgeIdentity(backend="rules", prompt_version="v1"),
    )


def intake(**kw) -> Intake:  # type: ignore[no-untyped-def]
    config = TrainerConfig(**kw)
    return Intake(config, None, DeadLetters(Settings().topics), Outbox(config.broker_retry))


def rec(s: Sample, offset: int = 0) -> SimpleNamespace:
    return SimpleNamespace(value=encode(s), topic="samples.scored", partition=0, offset=offset)


def test_stale_samples_are_dropped_or_kept_by_policy() -> None:
    drop = intake(max_staleness=4, stale_policy="drop")
    drop.accept(rec(sample(1, version=5)), None, policy_version=10)  # 5 behind: dropped
    drop.accept(rec(sample(2, version=6)), None, policy_version=10)  # 4 behind: kept
    assert drop.skipped["stale"] == 1 and [p.sample.sample_id for p in drop.pending] == ["s:2"]
    keep = intake(max_staleness=4, stale_policy="correct")
    keep.accept(rec(sample(1, version=0)), None, policy_version=10)
    assert len(keep.pending) == 1 and not keep.skipped


def test_excluded_and_duplicate_samples_take_no_slot() -> None:
    t = intake()
    t.ledger.add("s:1")
    for s in (sample(1), sample(2, mask=0), sample(3), sample(3)):
        t.accept(rec(s), None, policy_version=0)
    assert [p.sample.sample_id for p in t.pending] == ["s:3"]
    assert t.skipped == {"duplicate": 2, "excluded:neutral_score": 1}


def test_token_budget_batches() -> None:
    t = intake(max_tokens_per_batch=7)
    for i in range(5):
        t.accept(rec(sample(i)), None, policy_version=0)  # 3 tokens each
    assert t.batch_ready() and t.batch_size() == 2
    assert [s.sample_id for s in t.take_batch()] == ["s:0", "s:1"] and len(t.pending) == 3


def test_commit_offsets_hold_back_to_the_oldest_untrained_sample() -> None:
    t = intake()
    for offset in (5, 6):
        t.accept(rec(sample(offset), offset=offset), None, policy_version=0)
    assert t.held_offsets({0: 7, 1: 40}) == {0: 5, 1: 40}


def test_a_sample_whose_teacher_misses_tokens_trains_without_it_and_is_counted() -> None:
    from prometheus_client import REGISTRY

    name = "turnstream_trainer_teacher_misaligned_total"
    before = REGISTRY.get_sample_value(name) or 0  # process-wide: compare with the increase
    t = intake(mode="opd")
    short = sample(1).model_copy(update={"mode": "opd", "teacher_logprobs": []})
    covered = sample(2).model_copy(update={"mode": "opd", "teacher_logprobs": [-0.5]})
    for s in (short, covered):
        t.accept(rec(s), None, policy_version=0)
    assert [p.sample.teacher_logprobs for p in t.pending] == [None, [-0.5]]
    assert REGISTRY.get_sample_value(name) == before + 1


def test_ledger_is_bounded_and_the_log_follows_the_checkpoint(tmp_path: Path) -> None:
    ledger = Ledger(["a", "b"], size=2)
    ledger.add("c")
    assert "a" not in ledger and ledger.ids() == ["b", "c"]
    log = tmp_path / "ledger.tsv"
    log.write_text("1\ta\n1\tb\n2\tc\n3\td\n")  # step 3 was lost with the process
    reconcile_ledger_log(log, TrainerState(step=2, ledger=["a", "b", "c", "e"]))
    assert log.read_text() == "1\ta\n1\tb\n2\tc\n2\te\n"


def test_a_zero_score_with_loss_mask_1_is_trained() -> None:
    # A reward processor's 0 is a SUCCESS signal: the trainer goes by the mask, not the score.
    t = intake()
    zero = sample(1).model_copy(update={"score": 0.0, "reward_metrics": {"rule": 0.0}})
    t.accept(rec(zero), None, policy_version=0)
    assert [p.sample.sample_id for p in t.pending] == ["s:1"] and not t.skipped


NO_WAIT = RetryPolicy(None, initial_delay_s=0.0, max_delay_s=0.0)  # an outage's tries, at once


def test_a_commit_waits_out_a_broker_restart() -> None:
    flaky = FlakyConsumer(failures=3)
    commit_waiting(flaky, "samples.scored", {0: 7}, lambda: False, NO_WAIT)  # type: ignore[arg-type]
    assert [{tp.partition: m.offset for tp, m in c.items()} for c in flaky.committed] == [{0: 7}]
    # a stop during the outage: the checkpoint has the offsets
    down = FlakyConsumer(failures=10**6)
    commit_waiting(down, "samples.scored", {0: 7}, lambda: True, NO_WAIT)  # type: ignore[arg-type]
    assert down.committed == []


class FakeEngine:
    """Stands in for PolicyEngine and its DeepSpeed engine: a step is counted, a
    checkpoint is its client_state kept in memory (and a ``latest`` file)."""

    def __init__(self) -> None:
        self.engine = self
        self.steps = 0
        self.saved: dict = {}

    def train_step(
        self, batches: list, tokens: int, samples: int, update: bool = True
    ) -> StepMetrics:
        self.steps += 1
        n = sum(len(mb.input_ids) for mb in batches)
        assert n == samples
        zeros = dict.fromkeys(("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl"), 0.0)
        return StepMetrics(
            step=self.steps,
            samples=n,
            reward_mean=1.0,
            response_length=1.0,
            tokens=tokens,
            tokens_per_s=1.0,
            train_rollout_logprob_abs_diff=None,
            **zeros,
        )

    def save_checkpoint(self, save_dir: str, tag: str, client_state: dict) -> None:
        self.saved = copy.deepcopy(client_state)
        (Path(save_dir) / tag).mkdir(parents=True)
        (Path(save_dir) / "latest").write_text(tag)

    def load_checkpoint(self, load_dir: str) -> tuple[str, dict]:
        return load_dir, copy.deepcopy(self.saved)


def tokenized_trainer(
    tmp_path: Path, engine: FakeEngine, consumer: FlakyConsumer | None = None
) -> Trainer:
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        rollout_batch_size=2,
        update_weights_interval=0,
        metrics_jsonl=None,
        broker_retry_max_s=0.0,  # an outage's tries one after another
    )
    t = Trainer(Settings(), config, engine, SimpleNamespace(pad_token_id=0))
    t.source.consumer = consumer or FlakyConsumer(failures=0)  # what open() would connect
    return t


def poll(t: Trainer, records: list[SimpleNamespace], out: OutageProducer) -> None:
    """What ``Trainer._lead`` does with one poll's records, then the steps they fill."""
    for r in records:
        t.intake.accept(r, out, t.state.policy_version)  # type: ignore[arg-type]
        t.source.passed(r)
    t._steps_ready(out)  # type: ignore[arg-type]


def test_skip_counts_survive_a_restart_without_counting_twice(tmp_path: Path) -> None:
    # Records past the checkpoint's offsets (read while the next batch filled) are
    # read again after a kill -9: the checkpoint must not have counted them already.
    topic = [
        rec(sample(1), 0),
        rec(sample(1), 1),  # duplicate
        rec(sample(2, mask=0), 2),  # excluded
        rec(sample(3), 3),
        rec(sample(4, mask=0), 4),  # excluded
        rec(sample(5), 5),  # pending when the step is checkpointed: offsets held at 5
        rec(sample(5), 6),  # duplicate
        SimpleNamespace(value=b"{not json", topic="samples.scored", partition=0, offset=7),
        rec(sample(6), 8),
    ]
    engine, out = FakeEngine(), OutageProducer()
    first = tokenized_trainer(tmp_path, engine)
    poll(first, topic[:8], out)
    saved = engine.saved["trainer_state"]
    assert saved["offsets"] == {"0": 5} and saved["step"] == 1
    assert saved["skipped"] == {"duplicate": 1, "excluded:neutral_score": 2}
    assert first.intake.skipped == {"duplicate": 2, "excluded:neutral_score": 2, "invalid": 1}

    restarted = tokenized_trainer(tmp_path, engine)  # killed: resume from the checkpoint
    assert restarted.intake.skipped == {"duplicate": 1, "excluded:neutral_score": 2}
    poll(restarted, topic[restarted.source.positions[0] :], out)
    saved = engine.saved["trainer_state"]
    assert saved["offsets"] == {"0": 9} and saved["step"] == 2
    assert saved["ledger"] == ["s:1", "s:3", "s:5", "s:6"]
    real = {"duplicate": 2, "excluded:neutral_score": 2, "invalid": 1}
    assert saved["skipped"] == real and restarted.intake.skipped == real


def test_dead_letters_are_delivered_after_an_outage_before_the_commit(tmp_path: Path) -> None:
    garbage = SimpleNamespace(value=b"{not json", topic="samples.scored", partition=0, offset=0)
    engine, consumer = FakeEngine(), FlakyConsumer(failures=0)
    t = tokenized_trainer(tmp_path, engine, consumer)
    out = OutageProducer(failures=3)  # the broker stays down for three delivery timeouts
    t.intake.accept(garbage, out, 0)  # type: ignore[arg-type]
    t.source.passed(garbage)
    t._checkpoint_and_commit(out, [])  # type: ignore[arg-type]
    assert out.sends == 4  # sent again after each failure (at-least-once)
    assert [(topic, json.loads(v)["source"]) for topic, _k, v in out.delivered] == [
        (t.settings.topics.deadletter.name, "samples.scored/0/0")
    ]
    assert engine.saved["trainer_state"]["offsets"] == {"0": 1}
    assert [{tp.partition: m.offset for tp, m in c.items()} for c in consumer.committed] == [{0: 1}]
    assert not t.outbox.records


def test_a_stop_during_the_outage_leaves_the_dead_letters_to_the_restart(tmp_path: Path) -> None:
    garbage = SimpleNamespace(value=b"{not json", topic="samples.scored", partition=0, offset=0)
    engine, consumer = FakeEngine(), FlakyConsumer(failures=0)
    t = tokenized_trainer(tmp_path, engine, consumer)
    out = OutageProducer(failures=10**6)
    t.intake.accept(garbage, out, 0)  # type: ignore[arg-type]
    t.source.passed(garbage)
    t.requests.stop = True
    t._checkpoint_and_commit(out, [])  # type: ignore[arg-type]
    # neither a checkpoint nor a commit past the undelivered record: it is read again
    assert engine.saved == {} and consumer.committed == [] and len(t.outbox.records) == 1
    refused = OutageProducer(error=MessageSizeTooLargeError("too large"), failures=1)
    t.requests.stop = False  # a refusal that waiting cannot cure still fails loudly
    with pytest.raises(BrokerError, match="could not be delivered"):
        t._checkpoint_and_commit(refused, [])  # type: ignore[arg-type]


class RecordingEngine(FakeEngine):
    """A FakeEngine that keeps the rewards each step trained with."""

    def __init__(self) -> None:
        super().__init__()
        self.rewards: list[list[float]] = []

    def train_step(
        self, batches: list, tokens: int, samples: int, update: bool = True
    ) -> StepMetrics:
        self.rewards.append(sorted(r for mb in batches for r in mb.rewards.tolist()))
        return super().train_step(batches, tokens, samples)


def test_a_step_baseline_trains_on_advantages_and_reports_the_scores(tmp_path: Path) -> None:
    engine, out = RecordingEngine(), OutageProducer()
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        rollout_batch_size=4,
        update_weights_interval=0,
        metrics_jsonl=str(tmp_path / "metrics.jsonl"),
        step_baseline="mean",
    )
    t = Trainer(Settings(), config, engine, SimpleNamespace(pad_token_id=0))
    t.source.consumer = FlakyConsumer(failures=0)
    scores = [1.0, -1.0, -1.0, -1.0]
    samples = [sample(i).model_copy(update={"score": s}) for i, s in enumerate(scores)]
    poll(t, [rec(s, i) for i, s in enumerate(samples)], out)
    assert engine.rewards == [[-0.5, -0.5, -0.5, 1.5]]  # score - the step's mean
    [row] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_mean"] == -0.5  # the scores' mean, not the advantages' (0)


def test_a_prompt_grouped_baseline_centres_each_score_on_its_prompts_answers(
    tmp_path: Path,
) -> None:
    engine, out = RecordingEngine(), OutageProducer()
    config = TrainerConfig(
        checkpoint_dir=str(tmp_path / "ckpt"),
        rollout_batch_size=4,
        update_weights_interval=0,
        step_baseline="mean",
        baseline_group="prompt",
    )
    t = Trainer(Settings(), config, engine, SimpleNamespace(pad_token_id=0))
    t.source.consumer = FlakyConsumer(failures=0)
    asked = [([1, 2], 1.0), ([1, 2], -1.0), ([5, 6], -1.0), ([5, 6], -1.0)]
    samples = [
        sample(i).model_copy(update={"score": s, "prompt_ids": p}) for i, (p, s) in enumerate(asked)
    ]
    poll(t, [rec(s, i) for i, s in enumerate(samples)], out)
    assert engine.rewards == [[-1.0, 0.0, 0.0, 1.0]]  # by step: [-0.5, -0.5, -0.5, 1.5]
