"""`turnstream judge train`: a judge fine-tuned from labelled next states (registered on the
`judge` command group by pipeline.cli.rewards)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from pipeline.errors import TurnstreamError
from pipeline.judge_model.options import DEFAULTS, TuneOptions

console = Console(stderr=True, soft_wrap=True, highlight=False)


def judge_train(
    gold: Path = typer.Option(
        ..., "--gold", help="labelled JSONL (the gold format of `judge agreement`) to train on"
    ),
    heldout: Path = typer.Option(
        None, "--heldout", help="labelled JSONL never trained on: the agreement reported"
    ),
    base: str = typer.Option(
        "smollm2-135m-instruct", "--base", help="a catalogued model name or a checkpoint dir"
    ),
    output: Path = typer.Option(
        Path(".turnstream/judge"), "--output", help="where the trained judge is written"
    ),
    seed: int = typer.Option(DEFAULTS.seed, "--seed", help="shuffling and initialisation"),
    top_layers: int = typer.Option(
        DEFAULTS.top_layers, "--top-layers", min=1, help="decoder layers trained"
    ),
    epochs: int = typer.Option(DEFAULTS.epochs, "--epochs", min=1, help="passes over the examples"),
    lr: float = typer.Option(DEFAULTS.lr, "--lr", min=0.0, help="AdamW learning rate"),
    batch_size: int = typer.Option(
        DEFAULTS.batch_size, "--batch-size", min=1, help="examples per step"
    ),
) -> None:
    """Fine-tune the base model into a judge for the project's eval and hint prompts.

    Trains the top layers (DeepSpeed on CPU) on answers in exactly the form the
    scoring worker parses; prints the held-out agreement (Spearman rho, Cohen
    kappa, the confusion table), writes it beside the checkpoint with a
    manifest (turnstream-judge.json), and prints the directory last. Serve it
    with `turnstream serve --model DIR` and point `turnstream worker --judge
    sglang --judge-url` at the server.
    """
    from pipeline.judge_model.build import train_judge
    from pipeline.models import resolve_model
    from pipeline.settings import load_settings

    try:
        base_dir = resolve_model(base, load_settings().models, log=console.print)
        options = TuneOptions(
            top_layers=top_layers, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed
        )
        train_judge(gold, heldout, base_dir, output, options, console.print, base_name=base)
    except TurnstreamError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(1 if "gold" not in str(exc) else 2) from None
    print(output.resolve())
