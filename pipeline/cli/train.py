"""`turnstream train`: the DeepSpeed trainer consumer."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from pipeline.broker.clients import check_access
from pipeline.errors import ConfigError
from pipeline.settings import Settings, load_settings
from pipeline.training.config import TrainerConfig, config_help, load_trainer_config

if TYPE_CHECKING:
    from pipeline.replay.ranges import TopicRange


def train(
    config: Path = typer.Option(None, "--config", help="trainer options (YAML)"),
    max_steps: int = typer.Option(None, help="stop after this many optimizer steps"),
    until_end: bool = typer.Option(
        False, "--until-end", help="stop once samples.scored is consumed to its end"
    ),
    ledger: Path = typer.Option(None, help="append 'step<TAB>sample_id' per trained sample"),
    from_topic: str = typer.Option(
        None,
        help="offline: train on a fixed range of this topic (e.g. samples.scored or a "
        "rescored copy) and stop at its end",
    ),
    since: str = typer.Option(None, help="offline range start: ISO 8601 or epoch ms"),
    until: str = typer.Option(None, help="offline range end (exclusive)"),
    start_offsets: str = typer.Option(None, help="offline range start as PARTITION:OFFSET,..."),
    end_offsets: str = typer.Option(None, help="offline range end as PARTITION:OFFSET,..."),
    help_config: bool = typer.Option(False, "--help-config", help="list every option and exit"),
) -> None:
    """Consume samples.scored and train the policy (PPO / OPD / combine) with DeepSpeed.

    SIGTERM / Ctrl-C stop after the current step (checkpointed, offsets committed);
    SIGUSR1 trains what is on samples.scored at that moment, then stops (like
    --until-end, decided later).

    Offline (--from-topic with --since/--until or offsets): exactly that range,
    partition after partition in offset order, under its own consumer group;
    the same range, config and seed give the same batches in the same order.
    Give it its own checkpoint_dir.
    """
    if help_config:
        typer.echo(config_help())
        return
    from pipeline.training.signals import REQUESTS

    REQUESTS.install()  # before the model loads: an early signal is remembered
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from pipeline.training.run import run_trainer

    options = load_trainer_config(config, max_steps=max_steps)
    settings = load_settings()
    check_access(settings)  # before the model loads: a wrong password fails in seconds
    span = None
    if from_topic is not None:
        span, options = offline_range(
            settings, options, from_topic, since, until, start_offsets, end_offsets
        )
    elif any(v is not None for v in (since, until, start_offsets, end_offsets)):
        raise ConfigError("--since/--until/--start-offsets/--end-offsets need --from-topic")
    state = run_trainer(settings, options, until_end=until_end, ledger_log=ledger, span=span)
    typer.echo(
        f"trained {state.step} step(s); policy version {state.policy_version}; "
        f"skipped {state.skipped}"
    )


def offline_range(
    settings: Settings,
    options: TrainerConfig,
    from_topic: str,
    since: str | None,
    until: str | None,
    start_offsets: str | None,
    end_offsets: str | None,
) -> tuple[TopicRange, TrainerConfig]:
    """The range of ``from_topic`` an offline run trains on, and the options to train it with:
    the live trainer's consumer group gives way to one of the range's own."""
    from pipeline.cli.replay import physical
    from pipeline.replay.copy import replay_id_for
    from pipeline.replay.ranges import RangeRequest

    request = RangeRequest(since, until, start_offsets, end_offsets)
    span = request.resolve(settings, physical(settings, from_topic))
    if options.group_id == "turnstream-trainer":  # the live trainer's: use one of our own
        range_id = replay_id_for(span.topic, "train", spans=span.describe())
        options = replace(options, group_id=f"{options.group_id}.offline.{range_id}")
    typer.echo(
        f"offline training on {span.total} record(s) of {span.topic} {span.describe()} "
        f"(group {options.group_id})",
        err=True,
    )
    return span, options
