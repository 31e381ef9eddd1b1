"""Trainer metrics: Prometheus gauges, the JSONL log, and (optional) TensorBoard."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import Counter, Gauge, start_http_server

from pipeline.errors import ConfigError

STEP_FIELDS = (
    "loss",
    "pg_loss",
    "pg_clipfrac",
    "ppo_kl",
    "rollout_kl",
    "tis_weight_mean",
    "tis_clipfrac",
    "topk_kl",
    "teacher_gap",
    "entropy",
    "kl",
    "reward_mean",
    "response_length",
    "tokens_per_s",
    "samples_per_s",
    "train_rollout_logprob_abs_diff",
    "staleness",
    "lr",
    "policy_version",
    "step",
)
# The sentinels against reward hacking: the reward rising while these drift says the policy
# found a way to please its judge (learn puts them beside a held-out accuracy per version).
SENTINEL_HELP = {
    "reward_mean": "mean reward of the last step's samples (the training signal)",
    "teacher_gap": "opd/combine: mean teacher - old log-prob over the last step's taught "
    "tokens (what distillation raises: the training signal of opd)",
    "response_length": "mean response tokens of the last step's samples",
    "entropy": "policy entropy over the last step's response tokens, before its update",
    "kl": "KL of the policy to its initial weights over the last step's response tokens, "
    "before its update (kl_kind; measured while monitor_kl is on, penalised with kl_coef)",
}
SENTINELS = tuple(SENTINEL_HELP)  # what a version carries on policy.versions (PolicyVersion)
GAUGES = {
    name: Gauge(
        f"turnstream_trainer_{name}", SENTINEL_HELP.get(name, f"trainer {name} of the last step")
    )
    for name in STEP_FIELDS
}
SKIPPED = Counter(
    "turnstream_trainer_samples_skipped_total", "samples not trained, by reason", ["reason"]
)
WEIGHT_PUSH_FAILURES = Counter(
    "turnstream_trainer_weight_push_failures_total",
    "weight pushes given up (refused: a server unreachable or refusing after every try; "
    "error: an unexpected failure, logged with its traceback)",
    ["kind"],
)
TEACHER_MISALIGNED = Counter(
    "turnstream_trainer_teacher_misaligned_total",
    "samples whose teacher log-probs did not cover their response tokens (trained without "
    "an OPD signal)",
)


PERF = frozenset({"tokens", "tokens_per_s", "samples", "samples_per_s"})
GROUPS = {"time_s": "time", "skipped": "skipped", "push": "push"}  # a row's nested figures


def tensorboard_scalars(row: dict[str, Any]) -> list[tuple[str, float, int]]:
    """(tag, value, step) of every finite number in a metrics row: ``train/<name>``,
    ``perf/<name>``, ``time/<part>_s``, ``skipped/<reason>`` and ``push/bytes`` at its
    ``step``; at a weight push also ``version/<sentinel>`` at the version it made."""
    step = row["step"]
    out: list[tuple[str, float, int]] = []
    for name, value in row.items():
        if name in GROUPS and isinstance(value, dict):
            group = GROUPS[name]
            suffix = "_s" if group == "time" else ""
            out += [(f"{group}/{k}{suffix}", v, step) for k, v in value.items() if _finite(v)]
        elif name != "step" and _finite(value):
            out.append((f"{'perf' if name in PERF else 'train'}/{name}", value, step))
    if row.get("pushed"):
        version = row["policy_version"]
        out += [(f"version/{n}", row[n], version) for n in SENTINELS if _finite(row.get(n))]
    return out


def _finite(value: Any) -> bool:
    """A number TensorBoard can plot (not a flag, None, a NaN or an infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class MetricsSink:
    """Where each step's metrics go: Prometheus gauges, the JSONL log, TensorBoard's
    event files (flushed each step, so a running ``tensorboard`` shows it live)."""

    def __init__(
        self,
        jsonl: str | None,
        port: int,
        tensorboard_dir: str | None,
        host: str = "127.0.0.1",
    ) -> None:
        self.jsonl = Path(jsonl) if jsonl else None
        self.server = start_http_server(port, addr=host) if port else None
        self.writer = None
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ConfigError(
                    "tensorboard_dir is set but the tensorboard package is not "
                    "installed: pip install tensorboard"
                ) from exc
            self.writer = SummaryWriter(tensorboard_dir)
        self._skipped: dict[str, int] = {}

    @classmethod
    def of_rank(cls, config: Any, rank: int) -> MetricsSink:
        """Rank 0's sink as configured; other ranks record nothing."""
        if rank != 0:
            return cls(None, 0, None)
        return cls(
            config.metrics_jsonl, config.metrics_port, config.tensorboard_dir, config.metrics_host
        )

    def record(self, row: dict[str, Any]) -> None:
        for name in STEP_FIELDS:
            value = row.get(name)
            if isinstance(value, (int, float)):
                GAUGES[name].set(value)
        for reason, total in row.get("skipped", {}).items():
            SKIPPED.labels(reason).inc(total - self._skipped.get(reason, 0))
            self._skipped[reason] = total
        if self.jsonl is not None:
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
            with open(self.jsonl, "ab") as fh:
                fh.write(orjson.dumps(row) + b"\n")
        if self.writer is not None:
            for tag, value, step in tensorboard_scalars(row):
                self.writer.add_scalar(tag, value, step)
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the TensorBoard event file (the process is ending)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
