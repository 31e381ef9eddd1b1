"""`turnstream kafka start|stop|status`: the embedded local broker, or a local cluster."""

from __future__ import annotations

import typer
from rich.console import Console

from pipeline.broker.clients import admin_client
from pipeline.broker.cluster import LocalCluster, local_broker
from pipeline.broker.local import LocalKafka
from pipeline.errors import BrokerError
from pipeline.settings import load_settings

app = typer.Typer(
    help="Run the embedded Kafka broker, or a local cluster of them (KRaft, from Maven jars).",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)


def _local(brokers: int | None = None) -> LocalKafka | LocalCluster:
    settings = load_settings()
    if not settings.uses_local_broker:
        raise BrokerError(
            f"KAFKA_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is set: turnstream uses that "
            "cluster and does not manage a local broker. Unset it to use the local one."
        )
    return local_broker(settings.local_kafka, log=console.print, brokers=brokers)


@app.command()
def start(
    brokers: int | None = typer.Option(
        None,
        "--brokers",
        min=1,
        max=9,
        help="brokers to run, each also a KRaft controller (3: a three-voter quorum). "
        "Default: what the data dir holds, else TURNSTREAM_KAFKA_BROKERS (1)",
    ),
) -> None:
    """Start the broker(s) (idempotent); wait until each answers a metadata request.

    The bootstrap list is printed last; the other commands use it without a setting.
    """
    local = _local(brokers)
    local.start()
    console.print(f"bootstrap: {local.bootstrap}", highlight=False)


@app.command()
def stop() -> None:
    """Stop the broker(s) this project started (and nothing else)."""
    local = _local()
    if local.stop():
        console.print("Kafka stopped" if isinstance(local, LocalKafka) else "Kafka cluster stopped")
    else:
        console.print(f"no local Kafka is running from {local.settings.data_dir.resolve()}")


@app.command()
def status() -> None:
    """Print the bootstrap address, pid(s) and topics of the cluster in use."""
    settings = load_settings()
    if settings.uses_local_broker:
        local = local_broker(settings.local_kafka)
        where = settings.local_kafka.data_dir.resolve()
        console.print(f"bootstrap: {local.bootstrap}  (local, data in {where})", highlight=False)
        if isinstance(local, LocalCluster):
            _cluster_status(local)
        elif local.running:
            console.print(f"status: running, pid {local.pid()}")
        if not local.running:
            console.print("status: not running (start it with `turnstream kafka start`)")
            raise typer.Exit(3)
    else:
        console.print(f"bootstrap: {settings.bootstrap_servers}  (KAFKA_BOOTSTRAP_SERVERS)")
    admin = admin_client(settings)
    try:
        names = sorted(t for t in admin.list_topics() if not t.startswith("__"))
    finally:
        admin.close()
    console.print(f"topics ({len(names)}): " + (", ".join(names) if names else "none"))


def _cluster_status(cluster: LocalCluster) -> None:
    controller = cluster.active_controller() if cluster.running else None
    up = 0
    for node in cluster.nodes:
        role = "  active controller" if node.node == controller else ""
        state = f"running, pid {node.pid()}" if node.running else "not running"
        up += node.running
        console.print(f"node {node.node}: {node.bootstrap}  {state}{role}", highlight=False)
    if cluster.running:
        console.print(f"status: {up} of {cluster.size} nodes running")
