"""Prometheus metrics of the reward processors and of every observed processor.

Served with the scoring worker's /metrics (and any process's prometheus_client registry).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LENGTH_BIAS = Gauge(
    "turnstream_reward_length_bias",
    "correlation of reward score with response length over a sliding window "
    "(near 0: no length bias; toward 1: longer answers score higher)",
    ["processor", "method"],
)
JUDGE_CALLS_SAVED = Counter(
    "turnstream_reward_judge_calls_saved_total",
    "model judge runs skipped because the rule check failed (rule + model hybrid)",
    ["processor"],
)
PAIRWISE = Counter(
    "turnstream_reward_pairwise_verdicts_total",
    "pairwise judgements asked in both orders, by outcome ('inconsistent' = position bias)",
    ["outcome"],
)
GROUPS = Counter(
    "turnstream_reward_groups_total",
    "groups scored together, by outcome (complete, timed_out: scored with the members "
    "present; failed: every member went to samples.retry)",
    ["outcome"],
)
GROUP_MEMBERS_WAITING = Gauge(
    "turnstream_reward_group_members_waiting",
    "members held until their group is complete or times out",
)
PROCESSOR_CALLS = Counter(
    "turnstream_processor_calls_total",
    "calls of a processor's method marked @observe_processor, by status (success, failed: "
    "a FAILED output, exception: it raised) and error (failed, or the exception's type)",
    ["processor", "status", "error"],
)
PROCESSOR_SECONDS = Histogram(
    "turnstream_processor_seconds",
    "duration of each call of a processor's method marked @observe_processor",
    ["processor", "status"],
    buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0),
)
