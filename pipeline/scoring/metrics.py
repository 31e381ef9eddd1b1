"""Prometheus metrics of a scoring worker (served on its --web-host:--web-port at /metrics)."""

from __future__ import annotations

from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram, start_http_server

EVENTS = Counter(
    "turnstream_pairing_events_total", "chat.turns events by pairing outcome", ["outcome"]
)
PAIRED = Counter(
    "turnstream_turns_paired_total", "pairs emitted to turns.paired", ["has_next_state"]
)
VOTES = Counter(
    "turnstream_judge_votes_total", "judge votes by value ('failed' = no valid box)", ["value"]
)
JUDGE_CALLS = Histogram(
    "turnstream_judge_calls_per_turn",
    "judge calls spent on one turn",
    buckets=(0, 1, 2, 3, 4, 5, 6, 8, 12),
)
JUDGE_LATENCY = Histogram(
    "turnstream_judge_latency_seconds",
    "judging time of one turn",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
SCORES = Counter(
    "turnstream_samples_scored_total",
    "samples emitted, by score and exclusion",
    ["score", "exclude_reason"],
)
RETRIES = Counter("turnstream_samples_retry_total", "pairs sent to samples.retry")
IN_FLIGHT = Gauge("turnstream_judge_pairs_in_flight", "pairs being judged by this worker")
SKIPPED_RECOVERED = Counter(
    "turnstream_skipped_records_recovered_total",
    "records the Faust stream skipped that the offset guard read back",
    ["topic"],
)
REDELIVERED = Counter(
    "turnstream_redelivered_records_total",
    "records the Faust stream delivered again after this worker had them (not handled twice)",
    ["topic"],
)
STRANDED_SEEKS = Counter(
    "turnstream_stranded_partition_seeks_total",
    "seeks back to records a partition's stream stopped short of (no later record came)",
    ["topic"],
)
LAG = Gauge("turnstream_consumer_lag", "records behind the end of each input topic", ["topic"])


_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label set (it takes a lock each time)."""
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


def serve(port: int, host: str = "127.0.0.1") -> tuple[WSGIServer, Thread] | None:
    """Expose /metrics on ``host:port`` (port 0 = do not serve); the server and its thread."""
    if not port:
        return None
    return start_http_server(port, addr=host)
