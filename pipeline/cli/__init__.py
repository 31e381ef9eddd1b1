"""The `turnstream` command: one thin entry point per process over the library.

A command's module is imported when that command runs (or help lists it), so
`turnstream replay` does not pay for the trainer's or the demo's imports.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from pipeline.errors import TurnstreamError

# command -> (module, attribute): a function is one command, a Typer a group of them
COMMANDS: dict[str, tuple[str, str]] = {
    "produce": ("pipeline.cli.produce", "produce"),
    "worker": ("pipeline.cli.worker", "worker"),
    "retry": ("pipeline.cli.retry", "retry"),
    "train": ("pipeline.cli.train", "train"),
    "proxy": ("pipeline.cli.proxy", "proxy"),
    "serve": ("pipeline.cli.serve", "serve"),
    "replay": ("pipeline.cli.replay", "replay_cmd"),
    "rescore": ("pipeline.cli.replay", "rescore_cmd"),
    "demo": ("pipeline.cli.demo", "demo"),
    "learn": ("pipeline.cli.learn", "learn"),
    "kafka": ("pipeline.cli.kafka", "app"),
    "topics": ("pipeline.cli.topics", "app"),
    "models": ("pipeline.cli.models", "app"),
    "schema": ("pipeline.cli.schema", "app"),
    "offsets": ("pipeline.cli.replay", "offsets_app"),
    "reward": ("pipeline.cli.rewards", "reward_app"),
    "judge": ("pipeline.cli.rewards", "judge_app"),
    "rollout": ("pipeline.cli.rollout", "app"),
    "functions": ("pipeline.cli.functions", "app"),
    "console": ("pipeline.cli.console", "console"),
}


# group -> its commands that live in modules of their own: command -> (module, function).
# A group named here and not in COMMANDS is made of these alone.
GROUP_COMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "rollout": {
        "run": ("pipeline.cli.rollout_run", "run"),
        "submit": ("pipeline.cli.rollout_run", "submit"),
    },
}


def _load(module: str, attribute: str) -> Any:
    return getattr(importlib.import_module(module), attribute)


def _group(name: str) -> Any:
    """The group ``name``: its COMMANDS Typer (if any) with its GROUP_COMMANDS added."""
    if name in COMMANDS:
        app = _load(*COMMANDS[name])
    else:
        app = typer.Typer(no_args_is_help=True, help=f"turnstream {name} commands.")
    for command, (module, attribute) in GROUP_COMMANDS[name].items():
        app.command(command)(_load(module, attribute))
    return typer.main.get_group(app)


class _Commands(TyperGroup):
    """The top-level group: each command built from its module on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *GROUP_COMMANDS]))

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in COMMANDS and name not in GROUP_COMMANDS:
            return None
        if name not in self.commands:
            if name in GROUP_COMMANDS:
                command: Any = _group(name)
            else:
                target = _load(*COMMANDS[name])
                if isinstance(target, typer.Typer):
                    command = typer.main.get_group(target)
                else:
                    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
                    one.command(name)(target)
                    command = typer.main.get_command(one)
            command.name = name
            self.commands[name] = command
        return self.commands[name]


app = typer.Typer(
    name="turnstream",
    cls=_Commands,
    help="Online RL from live agent conversations, decoupled through Apache Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _turnstream() -> None:
    """Online RL from live agent conversations, decoupled through Apache Kafka."""


def _take_local_rank(argv: list[str]) -> list[str]:
    """Drop the ``--local_rank=N`` the ``deepspeed`` launcher inserts; keep it in LOCAL_RANK."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg.startswith(("--local_rank=", "--local-rank=")):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        elif arg in ("--local_rank", "--local-rank"):
            os.environ.setdefault("LOCAL_RANK", next(args, "0"))
        else:
            out.append(arg)
    return out


# Commands that hold nothing for the interpreter's teardown to finalize (their clients
# are closed, their files flushed): they end without it, ~0.15 s sooner (see _quick_exit).
QUICK_EXIT = {"produce", "replay", "rescore"}


def main() -> None:
    sys.argv = _take_local_rank(sys.argv)
    try:
        app()
    except SystemExit as exc:  # how Typer ends every command
        if len(sys.argv) > 1 and sys.argv[1] in QUICK_EXIT:
            _quick_exit(exc.code)
        raise
    except TurnstreamError as exc:
        _exit_with(str(exc))
    except Exception as exc:
        if not _refused_login(exc):
            raise
        from pipeline.broker.connection import authentication_failed
        from pipeline.settings import load_settings

        _exit_with(str(authentication_failed(load_settings(), exc)))


def _quick_exit(code: str | int | None) -> NoReturn:
    """Exit as ``sys.exit(code)`` would, but without the teardown of every module's objects:
    after the imports of a bulk command that is about 0.15 s, a tenth of a short replay.
    The atexit handlers run (logging's flush among them) and the streams are flushed; a
    stream that cannot be (a closed pipe) makes a clean exit 120, as at Python's own exit."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
    status = code if isinstance(code, int) else 0 if code is None else 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120
    os._exit(status)


def _refused_login(exc: Exception) -> bool:
    """kafka-python's refused SASL login, from a consumer built outside broker.clients
    (kafka-python is not imported on every command's path, and raises it only once it is)."""
    errors = sys.modules.get("kafka.errors")
    return errors is not None and isinstance(exc, errors.SaslAuthenticationFailedError)


def _exit_with(error: str) -> None:
    message = Text("error: ", style="bold red").append(error, style="")
    Console(stderr=True, soft_wrap=True).print(message, highlight=False)
    sys.exit(1)
