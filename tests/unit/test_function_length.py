"""No function in pipeline/ is longer than 60 lines (STYLE.md: functions do one thing).

A function's length runs from its `def` line to its last line, decorators
excluded; nested functions count in their enclosing function and on their own.
CLI commands are held to it too: a command keeps its signature and help, and
its body goes into helpers.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

MAX_LINES = 60
PIPELINE = REPO / "pipeline"


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, def line, length in lines) of every function in one file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                found.append((name, child.lineno, end - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_the_measure_counts_from_def_to_last_line_without_decorators(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(3))
    source.write_text(
        "import functools\n\n\n"
        "@functools.cache\n"
        f"def f():\n{body}\n\n\n"
        "class C:\n"
        "    async def g(self):\n"
        "        def inner():\n"
        "            return 1\n"
        "        return inner\n"
    )
    assert function_lengths(source) == [
        ("f", 5, 4),
        ("C.g", 12, 4),
        ("C.g.inner", 13, 2),
    ]


def test_no_function_in_pipeline_is_over_60_lines() -> None:
    too_long = [
        f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
        for path in sorted(PIPELINE.rglob("*.py"))
        for name, line, length in function_lengths(path)
        if length > MAX_LINES
    ]
    assert not too_long, f"functions over {MAX_LINES} lines:\n" + "\n".join(too_long)
