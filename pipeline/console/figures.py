"""Per policy version, the figures the console shows: from the samples scored on it and
from the trainer's metrics on policy.versions (pure functions of an index snapshot).

A policy.versions record carries the metrics of the step that made it, measured on the
weights before the update (:class:`~pipeline.training.weights.PolicyVersion`), so they are
the figures of the version published before it. A record's own ``heldout_accuracy`` (the
validation sentinel, when a run publishes one) is its own version's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.console.index import Snapshot, Version, VersionTally, version_order
from pipeline.learn.sentinels import SentinelRow, divergences
from pipeline.rewards.quality import length_bias

MIN_BIAS_POINTS = 20  # as the scoring stage's LengthBias: fewer points say nothing


@dataclass(frozen=True)
class VersionRow:
    """One row of the per-version table (None: not known for this version)."""

    version: Version
    samples: int = 0
    score_mean: float | None = None  # the judge's scores of its samples
    train_reward: float | None = None  # the trainer's batch reward mean
    teacher_gap: float | None = None  # the trainer's teacher − old log-prob per token
    heldout_accuracy: float | None = None
    response_tokens: float | None = None  # the trainer's response length
    response_chars: float | None = None  # its samples' response length
    entropy: float | None = None
    kl: float | None = None
    vote_agreement: float | None = None  # share of unanimous votes (2 votes or more)
    excluded_share: float | None = None
    length_bias: float | None = None  # Spearman of score with response length
    sample_teacher_gap: float | None = None  # its OPD samples: teacher − rollout per token
    published_ts: float | None = None
    divergence: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(mapping: Mapping[str, Any] | None, key: str) -> float | None:
    value = None if mapping is None else mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def trainer_figures(policy: Mapping[int, Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """version -> the step metrics measured on its weights: each record's belong to the
    version recorded before it (to ``version - 1`` for the first record read)."""
    out: dict[int, Mapping[str, Any]] = {}
    previous: int | None = None
    for version in sorted(policy):
        metrics = policy[version].get("step_metrics")
        if isinstance(metrics, Mapping):
            out.setdefault(version - 1 if previous is None else previous, metrics)
        previous = version
    return out


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _tally_figures(tally: VersionTally | None) -> dict[str, Any]:
    if tally is None or not tally.samples:
        return {}
    scores = [score for score, _ in tally.lengths]
    lengths = [float(chars) for _, chars in tally.lengths]
    bias = length_bias(scores, lengths) if len(scores) >= MIN_BIAS_POINTS else None
    return {
        "samples": tally.samples,
        "score_mean": tally.score_sum / tally.samples,
        "response_chars": tally.chars_sum / tally.samples,
        "vote_agreement": _share(tally.unanimous, tally.voted),
        "excluded_share": _share(tally.excluded, tally.samples),
        "length_bias": bias,
        "sample_teacher_gap": tally.gap_sum / tally.gap_tokens if tally.gap_tokens else None,
    }


def _trainer_row(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    return {
        "train_reward": _number(metrics, "reward_mean"),
        "teacher_gap": _number(metrics, "teacher_gap"),
        "response_tokens": _number(metrics, "response_length"),
        "entropy": _number(metrics, "entropy"),
        "kl": _number(metrics, "kl"),
    }


def version_rows(snapshot: Snapshot) -> list[VersionRow]:
    """One row per version seen in samples or on policy.versions, oldest first, with the
    sentinels' divergence (train reward up while held-out accuracy fell) marked."""
    trained = trainer_figures(snapshot.policy)
    versions: set[Version] = set(snapshot.tallies) | set(snapshot.policy) | set(trained)
    rows = []
    for version in sorted(versions, key=version_order):
        record = snapshot.policy.get(version) if version is not None else None
        rows.append(
            VersionRow(
                version=version,
                **_tally_figures(snapshot.tallies.get(version)),
                **_trainer_row(trained.get(version) if version is not None else None),
                heldout_accuracy=_number(record, "heldout_accuracy"),
                published_ts=_number(record, "ts"),
            )
        )
    return _flag_divergence(rows)


def _flag_divergence(rows: list[VersionRow]) -> list[VersionRow]:
    sentinel = [
        SentinelRow(r.version, r.train_reward, r.heldout_accuracy)
        for r in rows
        if r.version is not None
    ]
    flagged = {d.version: d.reason for d in divergences(sentinel)}
    return [
        VersionRow(**{**vars(r), "divergence": flagged[r.version]}) if r.version in flagged else r
        for r in rows
    ]
