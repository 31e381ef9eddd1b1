"""`turnstream reward test` and `turnstream judge agreement`: reward processors, run locally.

Exit status: 0 success; 1 a FAILED output, a processor error, or agreement
below a threshold; 2 bad input (a class path that does not load, a file that
is not the JSON expected, bad options).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import typer
from pydantic import ValidationError

from pipeline.cli.output import echo_json, fail
from pipeline.errors import ConfigError, RewardError
from pipeline.rewards import agreement as gold
from pipeline.rewards.combine import load_plan, load_weighted
from pipeline.rewards.loading import CLASSPATH_FORMS, load_processor
from pipeline.rewards.protocols import (
    close_processor,
    processor_name,
    run_group_processor,
    run_processor,
    setup_processor,
)
from pipeline.rewards.types import GroupRewardInput, GroupRewardOutput, RewardInput, RewardOutput

reward_app = typer.Typer(help="Reward processors: run one locally.", no_args_is_help=True)
judge_app = typer.Typer(help="Judge quality checks.", no_args_is_help=True)

DEFAULT_JUDGE = "pipeline.rewards.prm:PrmJudge"
PROCESSOR_HELP = f"the processor class: {CLASSPATH_FORMS}"
CONFIG_HELP = "a rewards YAML instead of --processor (its processors; its group: for a group input)"
OPTIONS_HELP = "constructor keywords as a JSON object, e.g. '{\"max_chars\": 2000}'"


def _build(
    processor: str | None, config: Path | None, options: str | None, group: bool = False
) -> Any:
    """The processor named on the command line, set up; bad names and options exit 2.

    With ``--config``, a group input (``group``) runs the file's ``group:`` entry
    and any other input its weighted ``processors``.
    """
    if (processor is None) == (config is None):
        fail(2, "give exactly one of --processor module:Class or --config rewards.yaml")
    built: Any  # a processor or a group processor, loaded by name: the input says which
    try:
        if config is not None:
            if options:
                fail(2, "--options goes with --processor; a rewards file has its own options")
            if group:
                plan = load_plan(config)
                if plan.group is None:
                    fail(2, f"{config}: the input is a group input but the file has no group:")
                built = plan.group.processor
            else:
                built = load_weighted(config)
        else:
            kwargs = orjson.loads(options) if options else {}
            if not isinstance(kwargs, dict):
                fail(2, f"--options must be a JSON object, got {type(kwargs).__name__}")
            built = load_processor(str(processor), kwargs)
    except orjson.JSONDecodeError as exc:
        fail(2, f"--options is not valid JSON: {exc}")
    except (RewardError, ConfigError) as exc:
        fail(2, str(exc))
    try:
        setup_processor(built)
    except RewardError as exc:
        fail(2, str(exc))
    return built


def _read_input(path: Path) -> RewardInput | GroupRewardInput:
    """A reward input, or a group input when it has ``agent_outputs``; problems exit 2."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        fail(2, f"{path}: cannot read: {exc.strerror or exc}")
    except orjson.JSONDecodeError as exc:
        fail(2, f"{path}: not valid JSON: {exc}")
    if not isinstance(data, dict):
        fail(2, f"{path}: expected a JSON object, got {type(data).__name__}")
    group = data.get("func_type") == "group_reward" or "agent_outputs" in data
    model: type[RewardInput] | type[GroupRewardInput] = GroupRewardInput if group else RewardInput
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: "
            + ("unknown field" if err["type"] == "extra_forbidden" else err["msg"])
            for err in exc.errors(include_url=False)
        ]
        fail(2, f"{path}: not a {model.__name__}:\n  " + "\n  ".join(problems))


async def _run_once(
    built: Any, data: RewardInput | GroupRewardInput
) -> RewardOutput | GroupRewardOutput:
    try:
        if isinstance(data, GroupRewardInput):
            return await run_group_processor(built, data)
        return await run_processor(built, data)
    finally:
        await close_processor(built)


@reward_app.command("test")
def reward_test(
    input: Path = typer.Option(..., "--input", help="a reward input JSON (group: agent_outputs)"),
    processor: str = typer.Option(None, "--processor", help=PROCESSOR_HELP),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    options: str = typer.Option(None, "--options", help=OPTIONS_HELP),
) -> None:
    """Run one reward processor on one input and print its output as JSON.

    The input has the reward SDK's shape: agent_output.messages, ground_truth,
    request_metadata, and optionally the judged response and its next_state.
    With agent_outputs (a list) it is a group input for a group processor.
    Exits 1 when the output is FAILED or the processor raises, 2 when the
    class path, the options or the input file cannot be used.
    """
    data = _read_input(input)
    built = _build(processor, config, options, group=isinstance(data, GroupRewardInput))
    name = processor_name(built)
    try:
        out = asyncio.run(_run_once(built, data))
    except RewardError as exc:
        fail(1, str(exc))
    except Exception as exc:
        fail(1, f"{name} raised {type(exc).__name__}: {exc}")
    echo_json(out.model_dump(mode="json"))
    if not out.ok:
        fail(1, f"{name} FAILED: {out.error}")


async def _score_all(built: Any, items: list[gold.GoldItem], concurrency: int) -> list[Any]:
    try:
        return await gold.score_gold(built, items, concurrency)
    finally:
        await close_processor(built)


def _gold_set(
    gold_path: Path | None, from_reviews: bool, write_gold: Path | None
) -> tuple[list[gold.GoldItem], str]:
    """The labelled inputs and where they came from; bad input exits 2."""
    if (gold_path is None) == (not from_reviews):
        fail(2, "give exactly one of --gold FILE or --from-reviews")
    if write_gold is not None and not from_reviews:
        fail(2, "--write-gold goes with --from-reviews")
    try:
        if gold_path is not None:
            return gold.load_gold(gold_path), str(gold_path)
        return _gold_from_reviews(write_gold)
    except RewardError as exc:
        fail(2, str(exc))


def _gold_from_reviews(write_gold: Path | None) -> tuple[list[gold.GoldItem], str]:
    """The reviews topic read to its end, each sample's latest review a gold line."""
    from pipeline.broker.reading import read_to_end
    from pipeline.console.reviews import gold_line, latest_reviews
    from pipeline.settings import load_settings

    settings = load_settings()
    topic = settings.topics.reviews.name
    reviews, problems = latest_reviews(read_to_end(settings, topic))
    for problem in problems:
        typer.echo(f"warning: skipped a record that is no review: {problem}", err=True)
    if not reviews:
        fail(2, f"no reviews on {topic} yet: record verdicts with `turnstream console --reviews`")
    lines = [orjson.dumps(gold_line(r)).decode() for r in reviews]
    if write_gold is not None:
        write_gold.write_text("".join(line + "\n" for line in lines))
    return gold.parse_gold(lines, f"topic {topic}"), f"topic {topic}"


@judge_app.command("agreement")
def judge_agreement(
    gold_path: Path = typer.Option(
        None, "--gold", help="labelled JSONL: one reward input per line with a numeric label"
    ),
    from_reviews: bool = typer.Option(
        False,
        "--from-reviews",
        help="the gold set is the reviews topic: each sample's latest human verdict "
        "(`turnstream console`) labels its response and next state",
    ),
    write_gold: Path = typer.Option(
        None, help="with --from-reviews: also write the gold set as JSONL here"
    ),
    processor: str = typer.Option(
        None, "--processor", help=f"{PROCESSOR_HELP} (default: the configured PRM judge)"
    ),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
    options: str = typer.Option(None, "--options", help=OPTIONS_HELP),
    concurrency: int = typer.Option(8, min=1, help="inputs scored at once"),
    min_rho: float = typer.Option(None, help="exit 1 when Spearman rho is below this"),
    min_kappa: float = typer.Option(None, help="exit 1 when Cohen kappa is below this"),
) -> None:
    """Score a labelled gold set and print Spearman rho, Cohen kappa and a confusion table.

    The default processor is the judge the scoring worker is configured with
    (TURNSTREAM_SCORING_JUDGE and friends; the offline default is the rules
    heuristic). Rho compares raw scores with the labels; kappa and the table
    bin each score to the nearest label. Run it after every change to a
    reward or the judge model, and compare. --from-reviews reads the gold set
    from the reviews topic instead of a file.
    """
    items, source = _gold_set(gold_path, from_reviews, write_gold)
    if processor is None and config is None:
        processor = DEFAULT_JUDGE
    built = _build(processor, config, options)
    describe = getattr(built, "describe", None)
    label = describe() if callable(describe) else processor_name(built)
    typer.echo(f"gold set: {source} ({len(items)} labelled inputs); processor: {label}")
    try:
        outputs = asyncio.run(_score_all(built, items, concurrency))
    except RewardError as exc:
        fail(1, str(exc))
    except Exception as exc:
        fail(1, f"{processor_name(built)} raised {type(exc).__name__}: {exc}")
    result = gold.report(items, outputs)
    typer.echo(gold.render(result))
    problems = []
    if result.failed:
        problems.append(f"{len(result.failed)} input(s) FAILED; the statistics leave them out")
    for name, value, floor in (("rho", result.rho, min_rho), ("kappa", result.kappa, min_kappa)):
        if floor is not None and (value is None or value < floor):
            problems.append(f"{name} {gold.describe(value)} is below --min-{name} {floor:g}")
    if problems:
        fail(1, "; ".join(problems))


def _register_train() -> None:
    from pipeline.cli.judge_train import judge_train

    judge_app.command("train")(judge_train)


_register_train()
