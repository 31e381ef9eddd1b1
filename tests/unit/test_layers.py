"""Production code never imports the test doubles: pipeline.testing is for tests only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
TEST_DOUBLES = "pipeline.testing"
A_TEST_DOUBLE = re.compile(r"pipeline\.testing(\.\w+)*")


def module_of(path: Path) -> str:
    parts = path.relative_to(PIPELINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The module an ``import from`` names, relative ones resolved against ``module``."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def doubles_used(source: str, module: str, is_package: bool = False) -> list[str]:
    """What ``source`` (the code of ``module``) takes from pipeline.testing, at which line:
    imports, and module paths spelled out (``python -m``, ``import_module``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(module, node, is_package)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if A_TEST_DOUBLE.fullmatch(node.value) else []
        if any(n == TEST_DOUBLES or n.startswith(TEST_DOUBLES + ".") for n in names):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import pipeline.testing.judge_sim", "pipeline.training.run"),
        ("from pipeline.testing.judge_sim import JudgeSimulator", "pipeline.training.run"),
        ("from pipeline import testing", "pipeline.training.run"),
        ("def f():\n    from ..testing import policy_sim", "pipeline.training.run"),
        ("from .testing.scripted_judge import ScriptedJudgeClient", "pipeline.demo"),
        ("spawn(['pipeline.testing.judge_sim', '--port', '1'])", "pipeline.demo"),
    ],
)
def test_the_check_sees_each_way_of_reaching_a_test_double(source: str, module: str) -> None:
    assert doubles_used(source, module)


def test_the_check_lets_other_imports_and_mentions_through() -> None:
    source = (
        '"""Judged like pipeline.testing.judge_sim answers."""\n'
        "from pipeline.training.tiny_tokenizer import make_tiny_tokenizer\n"
        "from . import testing_notes\n"
        "import pipeline.testingly\n"
    )
    assert doubles_used(source, "pipeline.training.run") == []


def test_no_production_module_imports_pipeline_testing() -> None:
    modules = [p for p in PIPELINE.rglob("*.py") if p.relative_to(PIPELINE).parts[0] != "testing"]
    assert len(modules) > 100  # the walk found the package
    uses = {
        str(path.relative_to(PIPELINE.parent)): found
        for path in modules
        if (found := doubles_used(path.read_text(), module_of(path), path.stem == "__init__"))
    }
    assert uses == {}, "production code reaches into pipeline.testing (tests only): " + str(uses)
