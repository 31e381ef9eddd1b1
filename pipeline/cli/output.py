"""What the local commands print: JSON on stdout, ``error: ...`` on stderr with an exit status."""

from __future__ import annotations

from typing import Any, NoReturn

import orjson
import typer
from rich.console import Console
from rich.text import Text

stderr = Console(stderr=True, soft_wrap=True)


def fail(code: int, message: str) -> NoReturn:
    """Print ``error: message`` on stderr and end the command with ``code``."""
    stderr.print(Text("error: ", style="bold red").append(message, style=""), highlight=False)
    raise typer.Exit(code)


def echo_json(data: Any) -> None:
    """``data`` as indented JSON on stdout."""
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
