"""`turnstream train`: the DeepSpeed trainer consumer."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from pipeline.settings import load_settings
from pipeline.training.config import config_help, load_trainer_config


def train(
    config: Path = typer.Option(None, "--config", help="trainer options (YAML)"),
    max_steps: int = typer.Option(None, help="stop after this many optimizer steps"),
    until_end: bool = typer.Option(
        False, "--until-end", help="stop once samples.scored is consumed to its end"
    ),
    ledger: Path = typer.Option(None, help="append 'step<TAB>sample_id' per trained sample"),
    help_config: bool = typer.Option(False, "--help-config", help="list every option and exit"),
) -> None:
    """Consume samples.scored and train the policy (PPO / OPD / combine) with DeepSpeed.

    SIGTERM / Ctrl-C stop after the current step (checkpointed, offsets committed);
    SIGUSR1 trains what is on samples.scored at that moment, then stops (like
    --until-end, decided later).
    """
    if help_config:
        typer.echo(config_help())
        return
    from pipeline.training.signals import REQUESTS

    REQUESTS.install()  # before the model loads: an early signal is remembered
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from pipeline.training.run import run_trainer

    options = load_trainer_config(config, max_steps=max_steps)
    state = run_trainer(load_settings(), options, until_end=until_end, ledger_log=ledger)
    typer.echo(
        f"trained {state.step} step(s); policy version {state.policy_version}; "
        f"skipped {state.skipped}"
    )
