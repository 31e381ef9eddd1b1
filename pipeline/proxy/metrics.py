"""Prometheus metrics of the capture proxy (served on its own port at /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

REQUESTS = Counter(
    "turnstream_proxy_requests_total",
    "chat requests by outcome (status code class or error kind) and streaming",
    ["outcome", "stream"],
)
TURNS = Counter(
    "turnstream_proxy_turns_total",
    "turn events produced, by turn type and whether the session id came from the client",
    ["turn_type", "session"],
)
SKIPPED = Counter(
    "turnstream_proxy_turns_not_recorded_total",
    "served requests that produced no turn, by reason",
    ["reason"],
)
SINK = Counter(
    "turnstream_proxy_sink_events_total",
    "events handed to Kafka, by outcome (delivered, retried, buffer_full, spooled)",
    ["outcome"],
)
BUFFERED = Gauge("turnstream_proxy_buffered_events", "events waiting for Kafka delivery")
UPSTREAM_LATENCY = Histogram(
    "turnstream_proxy_upstream_seconds",
    "time from forwarding a request to the upstream's last byte",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
POLICY_VERSION = Gauge("turnstream_proxy_policy_version", "policy version stamped on new turns")
# the newest held-out evaluation on policy.versions (the validation signal beside the
# trainer's turnstream_trainer_reward_mean; see pipeline.policy_records)
HELDOUT = {  # HeldoutEvaluation's field -> its gauge
    field: Gauge(f"turnstream_policy_{name}", text)
    for field, name, text in (
        ("version", "heldout_version", "policy version of the newest held-out evaluation"),
        ("heldout_accuracy", "heldout_accuracy", "its share of answers right (ground truth)"),
        ("heldout_success", "heldout_success", "its share right, short and ended by itself"),
        ("mean_words", "heldout_mean_words", "its mean words an answer"),
        ("degenerate", "heldout_degenerate", "its share of degenerate answers (empty, or one "
         "wrong word)"),
    )
}  # fmt: skip
ROLLOUT_ENDS = Counter(
    "turnstream_proxy_rollout_ends_total",
    "rollout sessions ended on the rollout route, by status (success, failed)",
    ["status"],
)
