"""Prometheus metrics of the judge client (served with the scoring worker's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter

JUDGE_RETRIES = Counter(
    "turnstream_judge_request_retries_total",
    "judge HTTP requests retried after a transient failure",
)
