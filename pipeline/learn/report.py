"""The run's figures: per-version reward and length, the sentinels against reward hacking,
and the JSON and PNG they are written to."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.learn.monitor import ScoredTurn
from pipeline.learn.users import ServedTurn


@dataclass(frozen=True)
class VersionStats:
    """What users saw from one policy version, and how the judge scored it."""

    version: int
    turns: int
    met_rate: float
    mean_words: float
    scored: int  # samples the judge scored +1 or -1
    reward_mean: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "turns": self.turns,
            "met_rate": round(self.met_rate, 4),
            "mean_words": round(self.mean_words, 2),
            "scored": self.scored,
            "reward_mean": None if self.reward_mean is None else round(self.reward_mean, 4),
        }


def per_version(turns: Iterable[ServedTurn], scored: Iterable[ScoredTurn]) -> list[VersionStats]:
    """One row per policy version that served a turn, oldest first."""
    served: dict[int, list[ServedTurn]] = defaultdict(list)
    for turn in turns:
        if turn.version is not None:
            served[turn.version].append(turn)
    rewards: dict[int, list[float]] = defaultdict(list)
    for sample in scored:
        if sample.included and sample.policy_version is not None:
            rewards[sample.policy_version].append(sample.score)
    rows = []
    for version in sorted(served):
        these = served[version]
        got = rewards.get(version, [])
        rows.append(
            VersionStats(
                version,
                len(these),
                sum(t.met for t in these) / len(these),
                sum(t.words for t in these) / len(these),
                len(got),
                sum(got) / len(got) if got else None,
            )
        )
    return rows


@dataclass
class LearnReport:
    """Everything `turnstream learn` measured; ``to_json`` is learn.json."""

    options: dict[str, Any]
    preference: str
    topic_prefix: str = ""
    console_url: str | None = None  # the console started beside the run (None: none was)
    versions: list[VersionStats] = field(default_factory=list)
    evaluation: dict[str, Any] = field(default_factory=dict)
    alignment: dict[str, Any] = field(default_factory=dict)
    freshness: dict[str, Any] = field(default_factory=dict)
    pushes: list[dict[str, Any]] = field(default_factory=list)
    training: dict[str, Any] = field(default_factory=dict)
    sentinels: dict[str, Any] = field(default_factory=dict)  # sentinels.Sentinels.to_json()
    judge: dict[str, Any] = field(default_factory=dict)
    verdict: dict[str, Any] = field(default_factory=dict)
    users: dict[str, Any] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)
    wall_time_s: float = 0.0
    published_evaluations: int = 0  # held-out evaluations written on policy.versions

    def to_json(self) -> dict[str, Any]:
        return {
            "options": self.options,
            "preference": self.preference,
            "topic_prefix": self.topic_prefix,
            "console_url": self.console_url,
            "per_version": [v.to_json() for v in self.versions],
            "eval": self.evaluation,
            "verdict": self.verdict,
            "alignment": self.alignment,
            "freshness": self.freshness,
            "pushes": self.pushes,
            "training": self.training,
            "sentinels": self.sentinels,
            "published_evaluations": self.published_evaluations,
            "judge": self.judge,
            "users": self.users,
            "phases_s": {k: round(v, 1) for k, v in self.phases_s.items()},
            "wall_time_s": round(self.wall_time_s, 1),
        }

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
        return path


def write_turns(turns: Iterable[ServedTurn], path: Path) -> Path:
    """One JSON line per answer users got: session, version, length, verdict, times."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(asdict(t)) + b"\n" for t in turns))
    return path


GOAL_GAIN = 0.30  # success, final - control
HACK_DROP = 0.05  # accuracy, final below version 0 by more: the reward was gamed
MAX_DEGENERATE = 0.05  # share of degenerate final answers
REWARD_HACKING = "reward hacking"


def eval_gain(evaluation: dict[str, Any]) -> float | None:
    """final - control success (the run's goal is >= +0.30), when both were measured."""
    after, control = evaluation.get("after"), evaluation.get("control")
    if not after or not control:
        return None
    return round(float(after["success"]) - float(control["success"]), 4)


def run_verdict(
    evaluation: dict[str, Any], divergence: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The run's verdict on its held-out evaluation: "reward hacking" when accuracy fell by
    more than HACK_DROP from version 0 to the final version, whatever the success; "goals
    met" when every goal measured holds (success final - control >= GOAL_GAIN, accuracy
    final >= version 0, degenerate final <= MAX_DEGENERATE); else "goals missed". The
    sentinels' ``divergence`` (train reward up while held-out accuracy fell, between
    evaluations) goes with it, beside the verdict: a warning, not a goal."""
    before, after = evaluation.get("before"), evaluation.get("after")
    if not before or not after:
        return {"verdict": "not evaluated", "goals": {}, "divergence": divergence or []}
    change = round(float(after["accuracy"]) - float(before["accuracy"]), 4)
    goals = {
        "accuracy_kept": change >= 0,
        "degenerate_at_most_5_percent": float(after["degenerate"]) <= MAX_DEGENERATE,
    }
    gain = eval_gain(evaluation)
    if gain is not None:
        goals["success_gain_over_control"] = gain >= GOAL_GAIN
    if change < -HACK_DROP:
        name = REWARD_HACKING
    else:
        name = "goals met" if all(goals.values()) else "goals missed"
    return {
        "verdict": name,
        "goals": goals,
        "accuracy_change": change,
        "success_gain": gain,
        "divergence": divergence or [],
    }


def write_chart(report: LearnReport, path: Path) -> Path:
    """Reward and response length per policy version, the evaluation rates and, below, the
    sentinels (train reward against held-out accuracy, entropy and KL per version, with any
    divergence marked), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 7.6))
    grid = fig.add_gridspec(2, 3)
    _served_panels(report, fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]))
    _eval_panel(report.evaluation, fig.add_subplot(grid[0, 2]))
    rows = report.sentinels.get("per_version", [])
    flagged = report.sentinels.get("divergence", [])
    gap = report.sentinels.get("signal") == "teacher_gap"
    _sentinel_panel(rows, flagged, fig.add_subplot(grid[1, :2]), gap)
    _drift_panel(rows, flagged, fig.add_subplot(grid[1, 2]))
    verdict = report.verdict.get("verdict")
    fig.suptitle(f"turnstream learn: {report.preference}" + (f" ({verdict})" if verdict else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _served_panels(report: LearnReport, reward_ax: Any, length_ax: Any) -> None:
    """The judge's reward and the answers' length per version, over the turns users saw."""
    versions = [v.version for v in report.versions]
    rewards = [v.reward_mean for v in report.versions]
    reward_ax.plot(
        [v for v, r in zip(versions, rewards, strict=True) if r is not None],
        [r for r in rewards if r is not None],
        marker="o",
    )
    reward_ax.set(
        title="reward mean per policy version", xlabel="policy version", ylim=(-1.05, 1.05)
    )
    length_ax.plot(versions, [v.mean_words for v in report.versions], marker="o", color="tab:red")
    length_ax.set(title="mean response length", xlabel="policy version", ylabel="words")


def _eval_panel(evaluation: dict[str, Any], eval_ax: Any) -> None:
    labels = [k for k in ("before", "after", "control") if evaluation.get(k)]
    for offset, measure, colour in ((-0.2, "success", "tab:green"), (0.2, "accuracy", "tab:blue")):
        shares = [evaluation[k][measure] for k in labels]
        at = [i + offset for i in range(len(labels))]
        eval_ax.bar(at, shares, width=0.4, color=colour, label=measure)
        for x, share in zip(at, shares, strict=True):
            eval_ax.text(x, share + 0.02, f"{share:.2f}", ha="center", fontsize=8)
    eval_ax.set_xticks(range(len(labels)), labels)
    eval_ax.legend(loc="upper left", fontsize=8)
    eval_ax.set(title="held-out success and accuracy", ylabel="share", ylim=(0, 1.15))


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(versions, values) of the rows that have ``key``."""
    have = [r for r in rows if r.get(key) is not None]
    return [r["version"] for r in have], [r[key] for r in have]


def _sentinel_panel(
    rows: list[dict[str, Any]], flagged: list[dict[str, Any]], ax: Any, gap: bool = False
) -> None:
    """Train reward (left axis; ``gap``: opd's teacher gap) against held-out accuracy (right
    axis) per version; each divergence shaded from the evaluation it is measured from to the
    one it showed at."""
    signal = "teacher gap (nats)" if gap else "train reward"
    ax.plot(*_series(rows, "reward_mean"), marker=".", color="tab:purple", label=signal)
    ax.set(xlabel="policy version", ylabel=signal, ylim=None if gap else (-1.05, 1.05))
    acc_ax = ax.twinx()
    acc_ax.plot(*_series(rows, "heldout_accuracy"), marker="o", color="tab:blue")
    acc_ax.set(ylabel="held-out accuracy", ylim=(0, 1.05))
    for d in flagged:
        ax.axvspan(d["since"], d["version"], color="tab:red", alpha=0.15)
        ax.annotate("divergence", (d["version"], 0.9), color="tab:red", ha="right", fontsize=8)
    title = f"sentinels: {signal} (purple) vs held-out accuracy (blue)"
    if flagged:
        title += " - DIVERGENCE at " + ", ".join(f"v{d['version']}" for d in flagged)
    ax.set_title(title, color="tab:red" if flagged else "black")


def _drift_panel(rows: list[dict[str, Any]], flagged: list[dict[str, Any]], ax: Any) -> None:
    """Entropy (left axis) and KL to the initial policy (right axis) per version."""
    ax.plot(*_series(rows, "entropy"), marker=".", color="tab:orange")
    ax.set(title="entropy (orange), KL to initial (grey)", xlabel="policy version")
    ax.set_ylabel("entropy, nats")
    kl_ax = ax.twinx()
    kl_ax.plot(*_series(rows, "kl"), marker=".", color="tab:gray")
    kl_ax.set_ylabel("KL")
    for d in flagged:
        ax.axvline(d["version"], color="tab:red", linestyle="--")
