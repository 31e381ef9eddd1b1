"""ARCHITECTURE.md names only files and definitions that exist, so the page cannot rot silently.

The page's anchors, line by line:

- a relative link ``[text](path)`` names a file or folder of the repository;
- a code span after a link to a ``.py`` file on the same line names something
  that file defines: ``name()`` or ``Class.method()`` (a function or method),
  ``Class`` (a class), ``Class.attribute`` (a method, or an attribute set in
  the class body or on ``self``);
- ``pipeline.module.name()`` names ``name`` in ``pipeline/module.py`` wherever it is.

A function or class with no file to belong to is an error too: every one the
page names is anchored. Other code spans (settings, attributes, headers, topic
names) are left alone.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGE = REPO / "ARCHITECTURE.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`]+)`")
CALL = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\(\)$")
CLASS = re.compile(r"^[A-Z]\w*[a-z]\w*(\.[A-Za-z_]\w*)?$")  # CapWords, not a CONSTANT
DOTTED = re.compile(r"^pipeline(\.[A-Za-z_]\w*)+\(\)$")


@cache
def definitions(path: Path) -> dict[str, set[str]]:
    """Qualified names a module defines -> the attributes each class defines ({} for others).

    Functions nest (``f.inner``); a class's attributes are its methods, the names
    assigned in its body and the ``self.x`` it assigns in any method.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, set[str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[prefix + node.name] = set()
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                name = prefix + node.name
                found[name] = class_attributes(node)
                visit(node.body, f"{name}.")

    visit(tree.body, "")
    return found


def class_attributes(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    names.add(t.attr)
    return names


def defines(path: Path, name: str) -> bool:
    """Whether ``path`` defines ``name`` (see the module docstring for the forms)."""
    found = definitions(path)
    if name in found:
        return True
    owner, _, attribute = name.rpartition(".")
    return bool(owner) and attribute in found.get(owner, set())


def anchors(text: str) -> list[tuple[int, Path | None, str]]:
    """(line number, file or None, name) of each code span the page anchors; a folder or
    file link itself comes as (line, path, "")."""
    out: list[tuple[int, Path | None, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        events = [(m.start(), "link", m.group(1)) for m in LINK.finditer(line)]
        events += [(m.start(), "code", m.group(1)) for m in CODE.finditer(line)]
        current: Path | None = None
        for _at, kind, value in sorted(events):
            if kind == "link":
                if re.match(r"^[a-z]+:|^#", value):
                    continue  # a URL or an anchor within the page
                path = REPO / value.split("#", 1)[0]
                out.append((number, path, ""))
                current = path if path.suffix == ".py" else None
            elif DOTTED.match(value):
                out.append((number, None, value))
            elif CALL.match(value) or CLASS.match(value):
                out.append((number, current, value))
    return out


def problems(text: str) -> list[str]:
    found = []
    for number, path, name in anchors(text):
        where = f"ARCHITECTURE.md:{number}"
        if name.startswith("pipeline."):
            parts = name.removesuffix("()").split(".")
            for cut in range(len(parts) - 1, 0, -1):
                module = REPO.joinpath(*parts[:cut]).with_suffix(".py")
                if module.is_file():
                    if not defines(module, ".".join(parts[cut:])):
                        found.append(f"{where}: {module.relative_to(REPO)} defines no {name}")
                    break
            else:
                found.append(f"{where}: {name} names no module under pipeline/")
        elif path is None:
            found.append(f"{where}: `{name}` follows no link to the file that defines it")
        elif not path.exists():
            found.append(f"{where}: {path.relative_to(REPO)} does not exist")
        elif name and not defines(path, name.removesuffix("()")):
            found.append(f"{where}: {path.relative_to(REPO)} defines no {name}")
    return found


def test_every_anchor_of_the_architecture_page_exists() -> None:
    text = PAGE.read_text()
    assert len(anchors(text)) > 50  # the page is read at all
    assert not problems(text), "\n".join(problems(text))


def test_readme_links_the_architecture_page() -> None:
    assert "](ARCHITECTURE.md)" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    ("line", "wrong"),
    [
        ("[x](pipeline/no_such_file.py)", "does not exist"),
        ("[x](pipeline/scoring/pairing.py) `no_such_step()`", "defines no no_such_step()"),
        ("[x](pipeline/scoring/pairing.py) `SessionState.no_such`", "defines no SessionState"),
        ("[x](pipeline/scoring/pairing.py) `NoSuchClass`", "defines no NoSuchClass"),
        ("`pair_step()` before any link", "follows no link"),
        ("`SessionState` before any link", "follows no link"),
        ("[a folder](pipeline/scoring/) `SessionState`", "follows no link"),
        ("`pipeline.scoring.pairing.no_such()`", "defines no pipeline.scoring.pairing"),
        ("`pipeline.no_such_module.f()`", "names no module"),
    ],
)
def test_a_wrong_anchor_is_named_with_its_line(line: str, wrong: str) -> None:
    found = problems(f"# page\n{line}\n")
    assert len(found) == 1 and found[0].startswith("ARCHITECTURE.md:2: ") and wrong in found[0]


def test_the_anchor_forms_that_exist_pass() -> None:
    text = (
        "[pairing](pipeline/scoring/pairing.py) `pair_step()`, `SessionState`, "
        "`SessionState.to_dict()`, `Step.state` and [a folder](pipeline/scoring/)\n"
        "[sink](pipeline/proxy/sink.py) `EventSink.diverted` (set on self), `X-Header`, "
        "`TURNSTREAM_X`, `current`\n"
        "`pipeline.scoring.pairing.pair_step()` anywhere; "
        "[server](pipeline/serving/server.py) `ServerState.push_lock`\n"
    )
    assert problems(text) == []
    assert [n for _l, _p, n in anchors(text) if n] == [
        "pair_step()",
        "SessionState",
        "SessionState.to_dict()",
        "Step.state",
        "EventSink.diverted",
        "pipeline.scoring.pairing.pair_step()",
        "ServerState.push_lock",
    ]
