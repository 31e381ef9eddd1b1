"""`turnstream topics plan|apply|export`: keep the cluster in line with topics.yaml."""

from __future__ import annotations

import typer
from rich.console import Console

from pipeline.settings import Settings, load_settings
from pipeline.topics import admin

app = typer.Typer(help="Compare, apply and export topics.yaml.", no_args_is_help=True)
console = Console(soft_wrap=True)

PROFILE_HELP = "a profile of topics.yaml, e.g. cluster (default: TURNSTREAM_TOPICS_PROFILE)"


def settings_with_profile(profile: str | None) -> Settings:
    """The settings, with ``--profile`` (when given) in place of TURNSTREAM_TOPICS_PROFILE."""
    return load_settings(topics_profile=profile) if profile else load_settings()


@app.command()
def plan(profile: str | None = typer.Option(None, help=PROFILE_HELP)) -> None:
    """Print the difference between topics.yaml and the cluster (changes nothing)."""
    settings = settings_with_profile(profile)
    changes = admin.plan(settings)
    against = f"{settings.bootstrap_servers} against {settings.topics.described}"
    if not changes:
        console.print(f"{against}: the cluster matches; nothing to change", highlight=False)
        return
    console.print(f"{against}:", highlight=False)
    for change in changes:
        console.print(str(change), highlight=False)
    if any(c.kind == "refused" for c in changes):
        raise typer.Exit(1)


@app.command()
def apply(profile: str | None = typer.Option(None, help=PROFILE_HELP)) -> None:
    """Create missing topics, raise partitions and alter configs to match topics.yaml."""
    settings = settings_with_profile(profile)
    changes = admin.apply(settings)
    if not changes:
        console.print(f"{settings.topics.described}: the cluster matches; nothing changed")
        return
    for change in changes:
        console.print(str(change), highlight=False)
    console.print(f"applied {len(changes)} change(s) to {settings.bootstrap_servers}")


@app.command()
def export(
    format: str = typer.Option("strimzi", "--format", help="only 'strimzi' (KafkaTopic)"),
    cluster: str = typer.Option("turnstream", help="value of the strimzi.io/cluster label"),
    namespace: str | None = typer.Option(None, help="metadata.namespace of each manifest"),
    profile: str | None = typer.Option(None, help=PROFILE_HELP),
) -> None:
    """Print topics.yaml as Kubernetes manifests."""
    if format != "strimzi":
        raise typer.BadParameter(f"unknown format {format!r}; supported: strimzi")
    topics = settings_with_profile(profile).topics
    typer.echo(admin.export_strimzi(topics, cluster, namespace), nl=False)
