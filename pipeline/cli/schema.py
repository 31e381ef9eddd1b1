"""`turnstream schema export`: JSON Schema of every event for other languages."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from pipeline.events import json_schemas

app = typer.Typer(help="Event schemas.", no_args_is_help=True)


@app.command()
def export(
    out_dir: Path = typer.Argument(Path("schemas"), help="directory to write *.schema.json"),
) -> None:
    """Write one JSON Schema file per event type."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, schema in json_schemas().items():
        (out_dir / name).write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n")
        typer.echo(out_dir / name)
