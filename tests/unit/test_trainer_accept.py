"""Which samples the trainer takes into a batch, and why it skips the others."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from pytest import MonkeyPatch

from pipeline.events import JudgeIdentity, Response, Sample, encode
from pipeline.settings import Settings
from pipeline.training.config import TrainerConfig
from pipeline.training.consumer import Ledger, Trainer, TrainerState, reconcile_ledger_log


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


def trainer(tmp_path: Path, **kw) -> Trainer:  # type: ignore[no-untyped-def]
    config = TrainerConfig(checkpoint_dir=str(tmp_path / "ckpt"), **kw)
    return Trainer(Settings(), config, engine=None, tokenizer=None)


def rec(s: Sample, offset: int = 0) -> SimpleNamespace:
    return SimpleNamespace(value=encode(s), topic="samples.scored", partition=0, offset=offset)


def test_stale_samples_are_dropped_or_kept_by_policy(tmp_path: Path) -> None:
    drop = trainer(tmp_path, max_staleness=4, stale_policy="drop")
    drop.state.policy_version = 10
    drop._accept(rec(sample(1, version=5)), out=None)  # 5 behind: dropped
    drop._accept(rec(sample(2, version=6)), out=None)  # 4 behind: kept
    assert drop.skipped["stale"] == 1 and [p.sample.sample_id for p in drop.pending] == ["s:2"]
    keep = trainer(tmp_path, max_staleness=4, stale_policy="correct")
    keep.state.policy_version = 10
    keep._accept(rec(sample(1, version=0)), out=None)
    assert len(keep.pending) == 1 and not keep.skipped


def test_excluded_and_duplicate_samples_take_no_slot(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    t.ledger.add("s:1")
    for s in (sample(1), sample(2, mask=0), sample(3), sample(3)):
        t._accept(rec(s), out=None)
    assert [p.sample.sample_id for p in t.pending] == ["s:3"]
    assert t.skipped == {"duplicate": 2, "excluded:neutral_score": 1}


def test_token_budget_batches(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_tokens_per_batch=7)
    for i in range(5):
        t._accept(rec(sample(i)), out=None)  # 3 tokens each
    assert t._batch_ready() and t._batch_size() == 2


def test_commit_offsets_hold_back_to_the_oldest_untrained_sample(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    for offset in (5, 6):
        t._accept(rec(sample(offset), offset=offset), out=None)
    t.positions = {0: 7, 1: 40}
    assert t._commit_offsets() == {0: 5, 1: 40}


def test_ledger_is_bounded_and_the_log_follows_the_checkpoint(tmp_path: Path) -> None:
    ledger = Ledger(["a", "b"], size=2)
    ledger.add("c")
    assert "a" not in ledger and ledger.ids() == ["b", "c"]
    log = tmp_path / "ledger.tsv"
    log.write_text("1\ta\n1\tb\n2\tc\n3\td\n")  # step 3 was lost with the process
    reconcile_ledger_log(log, TrainerState(step=2, ledger=["a", "b", "c", "e"]))
    assert log.read_text() == "1\ta\n1\tb\n2\tc\n2\te\n"


def test_a_zero_score_with_loss_mask_1_is_trained(tmp_path: Path) -> None:
    # A reward processor's 0 is a SUCCESS signal: the trainer goes by the mask, not the score.
    t = trainer(tmp_path)
    zero = sample(1).model_copy(update={"score": 0.0, "reward_metrics": {"rule": 0.0}})
    t._accept(rec(zero), out=None)
    assert [p.sample.sample_id for p in t.pending] == ["s:1"] and not t.skipped


class FlakyConsumer:
    """Refuses ``failures`` commits the way kafka-python does while the broker is down."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.committed: list[dict] = []

    def commit(self, offsets: dict, timeout_ms: int | None = None) -> None:
        from kafka.errors import KafkaConnectionError

        if self.failures:
            self.failures -= 1
            raise KafkaConnectionError("111 ECONNREFUSED")
        self.committed.append(offsets)


def test_a_commit_waits_out_a_broker_restart(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    import pipeline.training.consumer as consumer_module

    monkeypatch.setattr(consumer_module.time, "sleep", lambda _s: None)
    t = trainer(tmp_path)
    flaky = FlakyConsumer(failures=3)
    t._commit(flaky, {0: 7})  # type: ignore[arg-type]
    assert [{tp.partition: m.offset for tp, m in c.items()} for c in flaky.committed] == [{0: 7}]
    stopping = trainer(tmp_path)
    stopping.requests.stop = True  # a stop during the outage: the checkpoint has the offsets
    down = FlakyConsumer(failures=10**6)
    stopping._commit(down, {0: 7})  # type: ignore[arg-type]
    assert down.committed == []
