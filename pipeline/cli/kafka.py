"""`turnstream kafka start|stop|status`: the embedded local broker."""

from __future__ import annotations

import typer
from rich.console import Console

from pipeline.broker.clients import admin_client
from pipeline.broker.local import LocalKafka
from pipeline.errors import BrokerError
from pipeline.settings import load_settings

app = typer.Typer(
    help="Run the embedded single-node Kafka broker (KRaft, from Maven jars).", no_args_is_help=True
)
console = Console(soft_wrap=True)


def _local() -> LocalKafka:
    settings = load_settings()
    if not settings.uses_local_broker:
        raise BrokerError(
            f"KAFKA_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is set: turnstream uses that "
            "cluster and does not manage a local broker. Unset it to use the local one."
        )
    return LocalKafka(settings.local_kafka, log=console.print)


@app.command()
def start() -> None:
    """Start the broker (idempotent); wait until it answers a metadata request."""
    _local().start()


@app.command()
def stop() -> None:
    """Stop the broker this project started (and nothing else)."""
    local = _local()
    if local.stop():
        console.print("Kafka stopped")
    else:
        console.print(f"no local Kafka is running from {local.data_dir}")


@app.command()
def status() -> None:
    """Print the bootstrap address, pid and topics of the cluster in use."""
    settings = load_settings()
    if settings.uses_local_broker:
        st = LocalKafka(settings.local_kafka).status()
        console.print(f"bootstrap: {st.bootstrap}  (local broker, data in {st.data_dir})")
        if not st.running:
            console.print("status: not running (start it with `turnstream kafka start`)")
            raise typer.Exit(3)
        console.print(f"status: running, pid {st.pid}")
    else:
        console.print(f"bootstrap: {settings.bootstrap_servers}  (KAFKA_BOOTSTRAP_SERVERS)")
    admin = admin_client(settings)
    try:
        names = sorted(t for t in admin.list_topics() if not t.startswith("__"))
    finally:
        admin.close()
    console.print(f"topics ({len(names)}): " + (", ".join(names) if names else "none"))
