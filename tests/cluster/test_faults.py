"""Broker faults on a three-broker cluster under load lose nothing (make test-cluster).

Each scenario runs simulated users through the capture proxy, two scoring workers and the
trainer on topics of the cluster profile (three replicas, min.insync.replicas 2, acks=all),
and while the users talk:

- ``leader``: SIGKILL the broker that leads the most partitions, restart it (twice);
- ``rolling``: a rolling restart, each broker stopped and started in turn, the next one once
  every partition is back in sync;
- ``controller``: SIGKILL the active KRaft controller, restart it (twice);
- ``long``: one broker down for longer than the longest delivery timeout of a producer.

Every run: no turn lost, every turn scored (or on samples.retry with its reason), every
included sample trained exactly once, no score but the judge's own votes, no error a user
sees, duplicates within the soak test's bound per fault. The time to the first sample
scored and trained after each fault (p50 and max) is printed (run with ``-s``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from pipeline.broker.cluster import LocalCluster
from tests.cluster.stack import Stack, percentiles, stack_settings, wait_in_sync

DOWN_S = 15.0  # a killed broker's time down: longer than the controller's session timeout
AFTER_S = 12.0  # the load on, the cluster whole, before the next fault
LONGEST_DELIVERY_TIMEOUT_S = 120.0  # pipeline.broker.clients.producer (the proxy's: 30 s)


def most_leading(stack: Stack) -> int:
    counts = stack.cluster.leader_counts([t.name for t in stack.settings.topics])
    return max((n for n in counts if n > 0), key=lambda n: counts[n])


def kill_and_restart(stack: Stack, node: int, down_s: float) -> tuple[float, float]:
    """SIGKILL ``node``, keep it down ``down_s`` under load, restart it, and keep the load on
    a while, so the next fault's pause is not counted as this one's: (fault, back)."""
    fault_at = time.monotonic()
    stack.cluster.node(node).kill()
    stack.hold(down_s)
    stack.cluster.restart(node)
    back_at = time.monotonic()
    stack.hold(AFTER_S)
    return fault_at, back_at


def leader_kills(stack: Stack) -> list[tuple[float, float]]:
    return [kill_and_restart(stack, most_leading(stack), DOWN_S) for _ in range(2)]


def controller_kills(stack: Stack) -> list[tuple[float, float]]:
    faults = []
    for _ in range(2):
        controller = stack.cluster.active_controller()
        assert controller is not None
        faults.append(kill_and_restart(stack, controller, DOWN_S))
        deadline = time.monotonic() + 60
        while stack.cluster.active_controller() is None:  # a leader elected again
            assert time.monotonic() < deadline
            time.sleep(0.2)
    return faults


def rolling_restart(stack: Stack) -> list[tuple[float, float]]:
    topics = [t.name for t in stack.settings.topics]
    faults = []
    for node in stack.cluster.nodes:
        wait_in_sync(stack.cluster, topics)
        fault_at = time.monotonic()
        assert node.stop(timeout_s=60)  # SIGTERM: a controlled shutdown
        stack.cluster.restart(node.node)
        faults.append((fault_at, time.monotonic()))
        stack.hold(5)
    wait_in_sync(stack.cluster, topics)
    return faults


def long_outage(stack: Stack) -> list[tuple[float, float]]:
    return [kill_and_restart(stack, most_leading(stack), LONGEST_DELIVERY_TIMEOUT_S + 10)]


SCENARIOS: dict[str, Callable[[Stack], list[tuple[float, float]]]] = {
    "leader": leader_kills,
    "rolling": rolling_restart,
    "controller": controller_kills,
    "long": long_outage,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_broker_faults_under_load_lose_nothing(
    scenario: str, healthy: LocalCluster, prefix: str, tmp_path
) -> None:
    stack = Stack(healthy, stack_settings(healthy, prefix), tmp_path)
    try:
        stack.start()
        stack.wait_training(20)
        started = time.monotonic()
        faults = SCENARIOS[scenario](stack)
        stack.hold(10)
        ended = time.monotonic()
        audit = stack.finish()
    finally:
        stack.close()
    assert stack.monitor is not None
    untils = [fault for fault, _ in faults[1:]] + [ended]
    recoveries = [
        stack.monitor.recovery(fault, back, until)
        for (fault, back), until in zip(faults, untils, strict=True)
    ]
    figures = {
        "scenario": scenario,
        "faults": len(faults),
        "seconds": round(time.monotonic() - started, 1),
        **audit.summary(),
        **{
            f"{key}_{stat}": value
            for key in recoveries[0]
            for stat, value in percentiles([r[key] for r in recoveries]).items()
        },
        "per_fault": recoveries,
    }
    print(f"\ncluster fault {scenario}: " + json.dumps(figures))
    audit.assert_nothing_lost(len(faults))
    # scoring goes on while one broker of three is away: the pause is the leader election's
    # (the controller fences a killed broker after its session timeout, 9 s by default)
    assert all(0 <= r["longest_scoring_pause_s"] <= 30 for r in recoveries), recoveries
    assert all(0 <= r["first_scored_after_back_s"] <= 30 for r in recoveries), recoveries
    assert all(0 <= r["first_trained_after_back_s"] <= 60 for r in recoveries), recoveries
