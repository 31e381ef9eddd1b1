"""`turnstream functions check`: the components of a functions file load, are their kind, set up.

The local counterpart of the SDK guide's `register_functions`. Exit status: 0
every entry can be used; 1 one or more cannot (its line says which and why);
2 the file itself cannot be used.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from pipeline.cli.output import fail
from pipeline.errors import ConfigError
from pipeline.rollouts.components import FunctionSpec, check_function, load_functions

app = typer.Typer(
    help="Function components (rollout, reward, group reward): check them locally.",
    no_args_is_help=True,
)


async def _check_all(entries: list[tuple[str, FunctionSpec]]) -> list[str | None]:
    return [await check_function(spec) for _key, spec in entries]


def _line(key: str, spec: FunctionSpec, problem: str | None) -> str:
    label = f"{key} {spec.name} ({spec.type})" if spec.name else f"{key} ({spec.type})"
    return (
        f"ok      {label}: {spec.classpath}" if problem is None else f"FAILED  {label}: {problem}"
    )


@app.command("check")
def functions_check(
    file: Path = typer.Argument(
        ..., help="a functions YAML: a list (or functions: a list) of {name, type, classpath}"
    ),
) -> None:
    """Load every component of FILE, check it is its type, run its setup(); one line each.

    An entry is {name (optional), type: rollout | reward | group_reward,
    classpath}, with class paths in any of the loader's forms, looked up from
    the working directory (examples/sdk/functions.yaml is run from
    examples/sdk). An entry fails when it does not import or build, has no
    process() taking one input, declares another kind (its base class, or the
    type of its process() input or output), or its setup() raises or is
    async. Exits 1 when any entry fails, 2 when the file cannot be used.
    """
    try:
        entries = load_functions(file)
    except ConfigError as exc:
        fail(2, str(exc))
    problems = asyncio.run(_check_all(entries))
    for (key, spec), problem in zip(entries, problems, strict=True):
        typer.echo(_line(key, spec, problem))
    bad = sum(p is not None for p in problems)
    if bad:
        fail(1, f"{file}: {bad} of {len(entries)} function(s) cannot be used")
    typer.echo(f"{file}: all {len(entries)} function(s) load and set up")
