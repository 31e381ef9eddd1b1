"""`turnstream topics plan|apply|export`: keep the cluster in line with topics.yaml."""

from __future__ import annotations

import typer
from rich.console import Console

from pipeline.settings import load_settings
from pipeline.topics import admin

app = typer.Typer(help="Compare, apply and export topics.yaml.", no_args_is_help=True)
console = Console(soft_wrap=True)


@app.command()
def plan() -> None:
    """Print the difference between topics.yaml and the cluster (changes nothing)."""
    settings = load_settings()
    changes = admin.plan(settings)
    if not changes:
        console.print(f"{settings.topics.source}: the cluster matches; nothing to change")
        return
    for change in changes:
        console.print(str(change), highlight=False)
    if any(c.kind == "refused" for c in changes):
        raise typer.Exit(1)


@app.command()
def apply() -> None:
    """Create missing topics, raise partitions and alter configs to match topics.yaml."""
    settings = load_settings()
    changes = admin.apply(settings)
    if not changes:
        console.print(f"{settings.topics.source}: the cluster matches; nothing changed")
        return
    for change in changes:
        console.print(str(change), highlight=False)
    console.print(f"applied {len(changes)} change(s) to {settings.bootstrap_servers}")


@app.command()
def export(
    format: str = typer.Option("strimzi", "--format", help="only 'strimzi' (KafkaTopic)"),
    cluster: str = typer.Option("turnstream", help="value of the strimzi.io/cluster label"),
    namespace: str | None = typer.Option(None, help="metadata.namespace of each manifest"),
) -> None:
    """Print topics.yaml as Kubernetes manifests."""
    if format != "strimzi":
        raise typer.BadParameter(f"unknown format {format!r}; supported: strimzi")
    typer.echo(admin.export_strimzi(load_settings().topics, cluster, namespace), nl=False)
