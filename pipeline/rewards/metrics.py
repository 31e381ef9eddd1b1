"""Prometheus metrics of the reward processors (served with the scoring worker's /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
