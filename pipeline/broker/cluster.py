"""A local Kafka cluster: N brokers from the same jars, each also a KRaft voter.

``turnstream kafka start --brokers 3`` runs three :class:`LocalKafka` nodes in
``node-1/`` .. ``node-3/`` of the data dir, on ports 9092/9093, 9094/9095 and
9096/9097 by default, with a static quorum of all three controllers (combined
roles). ``cluster.json`` in the data dir records the count and the cluster id:
``kafka stop``, ``kafka status`` and every other command read it, so the
bootstrap list needs no setting once the cluster has started.

The fault tests drive it through :meth:`LocalCluster.node` (SIGKILL, restart),
:meth:`active_controller` and :meth:`leader_counts`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.broker.local import BrokerStatus, LocalKafka, admin_for, new_cluster_id
from pipeline.errors import BrokerError
from pipeline.settings import LocalKafkaSettings

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterStatus:
    bootstrap: str
    nodes: list[BrokerStatus]

    @property
    def running(self) -> bool:
        return any(node.running for node in self.nodes)


class LocalCluster:
    """Start, stop and inspect the nodes of one local cluster (one data dir)."""

    def __init__(
        self,
        settings: LocalKafkaSettings,
        brokers: int | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.settings = settings
        self.log = log
        on_disk = settings.node_count if settings.layout_file.exists() else None
        self.size = brokers or on_disk or settings.brokers
        if on_disk is not None and on_disk != self.size:
            raise BrokerError(
                f"{settings.data_dir.resolve()} holds a {on_disk}-broker cluster, not "
                f"{self.size}: stop it and remove the directory, or use another "
                "TURNSTREAM_KAFKA_DATA_DIR"
            )
        if self.size > 1 and (settings.data_dir / "data" / "meta.properties").exists():
            raise BrokerError(
                f"{settings.data_dir.resolve()} holds a single broker's storage: remove it, or "
                "start the cluster in another TURNSTREAM_KAFKA_DATA_DIR"
            )
        self.cluster_id = str(self._layout().get("cluster_id") or new_cluster_id())
        self.nodes = [
            LocalKafka(settings, log, node=n, nodes=self.size, cluster_id=self.cluster_id)
            for n in range(1, self.size + 1)
        ]

    def _layout(self) -> dict[str, object]:
        try:
            layout = json.loads(self.settings.layout_file.read_text())
        except (OSError, ValueError):
            return {}
        return layout if isinstance(layout, dict) else {}

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def running(self) -> bool:
        return any(node.running for node in self.nodes)

    def node(self, node_id: int) -> LocalKafka:
        return self.nodes[node_id - 1]

    def status(self) -> ClusterStatus:
        return ClusterStatus(self.bootstrap, [node.status() for node in self.nodes])

    def start(self) -> ClusterStatus:
        """Start every node that is not running; return once each answers metadata and the
        cluster counts all of its brokers."""
        if all(node.running for node in self.nodes):
            self.log(f"Kafka cluster of {self.size} already running at {self.bootstrap}")
            return self.status()
        stopped = [node for node in self.nodes if not node.running]
        for node in stopped:
            node.check_ports()
        self.nodes[0].resolve_jars()
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.settings.layout_file.write_text(
            json.dumps({"brokers": self.size, "cluster_id": self.cluster_id}) + "\n"
        )
        started = time.monotonic()
        launched = {}
        try:
            for node in stopped:
                launched[node.node] = node.launch()
            for node in self.nodes:
                if node.node in launched:
                    node.wait_ready(launched[node.node])
            self.wait_brokers(self.size)
        except BaseException:
            self.stop()
            raise
        self.log(
            f"Kafka cluster of {self.size} ready at {self.bootstrap} "
            f"in {time.monotonic() - started:.1f}s"
        )
        return self.status()

    def restart(self, node_id: int) -> float:
        """Start one stopped node again (same ports and storage); seconds until it is back
        in the cluster's metadata."""
        node = self.node(node_id)
        started = time.monotonic()
        node.wait_ready(node.launch())
        self.wait_brokers(self.size)
        return time.monotonic() - started

    def stop(self, timeout_s: float = 60.0) -> bool:
        """Stop every node at once (a controlled shutdown each); True if any was running."""
        stopping = [node for node in self.nodes if node.terminate()]
        for node in stopping:
            node.wait_stopped(timeout_s)
        return bool(stopping)

    def ask(self, question: Callable[[Any], T], timeout_s: float = 30.0) -> T:
        """``question(admin)`` of the running nodes in turn until one answers: while a node
        is down the others' metadata may still name it, and a request sent there fails."""
        from kafka.errors import KafkaError

        deadline = time.monotonic() + timeout_s
        while True:
            for node in self.nodes:
                if not node.running:
                    continue
                try:
                    admin = admin_for(node.bootstrap)
                except (KafkaError, OSError, ValueError):
                    continue
                try:
                    return question(admin)
                except (KafkaError, OSError):
                    continue
                finally:
                    admin.close()
            if time.monotonic() > deadline:
                raise BrokerError(f"no node of the cluster at {self.bootstrap} answered")
            time.sleep(0.5)

    def broker_ids(self) -> list[int]:
        """The unfenced brokers the cluster's metadata lists now."""
        brokers = self.ask(lambda admin: admin.describe_cluster()["brokers"])
        return sorted(b["broker_id"] for b in brokers if not b.get("is_fenced"))

    def wait_brokers(self, count: int, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.settings.start_timeout_s)
        while len(self.broker_ids()) < count:  # a restarted node: unfenced once caught up
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the cluster at {self.bootstrap} did not list {count} brokers within "
                    f"{timeout_s or self.settings.start_timeout_s:.0f}s (it lists "
                    f"{self.broker_ids()})\n" + "\n".join(n.log_tail(10) for n in self.nodes)
                )
            time.sleep(0.5)

    def active_controller(self) -> int | None:
        """The KRaft leader: the newest epoch's leader in the running voters' quorum state."""
        best: tuple[int, int] | None = None
        for node in self.nodes:
            path = node.storage / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            epoch, leader = int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))
            if node.running and leader > 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        return best[1] if best else None

    def leader_counts(self, topics: list[str]) -> Counter[int]:
        """How many partitions of ``topics`` each broker leads (-1: no leader)."""
        described = self.ask(lambda admin: admin.describe_topics(topics))
        return Counter(p["leader_id"] for t in described for p in t["partitions"])


def local_broker(
    settings: LocalKafkaSettings, log: Callable[[str], None] = print, brokers: int | None = None
) -> LocalKafka | LocalCluster:
    """The data dir's broker: one ``LocalKafka``, or the cluster its layout (or ``brokers``)
    says."""
    size = brokers or settings.node_count
    if size == 1 and not settings.layout_file.exists():
        return LocalKafka(settings, log)
    return LocalCluster(settings, brokers, log)
