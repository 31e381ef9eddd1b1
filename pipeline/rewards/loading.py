"""Load a processor class from a class path, in the three forms the reward SDK guide uses.

- ``package.module:Class``: a module on the path (the working directory included);
- ``package.module.Class``: the same, dotted; the last component is the class;
- ``path/to/file.py:Class``: a file, relative to the working directory or absolute;
  what it imports is looked up from the working directory too.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pipeline.errors import RewardError

CLASSPATH_FORMS = "package.module:Class, package.module.Class or path/to/file.py:Class"


def _cwd_on_path() -> None:
    """Modules are looked up from the working directory too, as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _import_file(path: Path, where: str) -> ModuleType:
    if not path.is_file():
        looked = "" if path.is_absolute() else f" (looked for {path.resolve()})"
        raise RewardError(f"{where}{path}: no such file{looked}")
    _cwd_on_path()  # the file may import its own package, as examples/rewards/*.py do
    resolved = path.resolve()
    name = f"_turnstream_reward_{resolved.stem}_{hashlib.sha1(bytes(resolved)).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise RewardError(f"{where}{path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise RewardError(f"{where}importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(dotted: str, where: str, classpath: str) -> ModuleType:
    _cwd_on_path()
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if dotted == missing or dotted.startswith(missing + "."):
            raise RewardError(
                f"{where}no module named {missing!r} (for {classpath!r}); run from the "
                "directory that holds it, put it on PYTHONPATH, or give a file path: "
                "path/to/file.py:Class"
            ) from exc
        raise RewardError(f"{where}importing {dotted!r} (for {classpath!r}) failed: {exc}") from exc
    except Exception as exc:
        raise RewardError(
            f"{where}importing {dotted!r} (for {classpath!r}) failed: {type(exc).__name__}: {exc}"
        ) from exc


def split_classpath(classpath: str, where: str = "") -> tuple[str, str]:
    """``(module or file, attribute)`` of a class path in any of its three forms."""
    module_part, sep, attr = classpath.partition(":")
    if not sep:
        if classpath.endswith(".py") or "/" in classpath:
            raise RewardError(
                f"{where}{classpath!r} is not a class path: a file path names its class "
                "after a colon (path/to/file.py:Class)"
            )
        module_part, _, attr = classpath.rpartition(".")
    if not module_part or not attr:
        raise RewardError(f"{where}{classpath!r} is not a class path ({CLASSPATH_FORMS})")
    return module_part, attr


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError):
        return False


def _defined_classes(module: ModuleType) -> str:
    names = sorted(
        name
        for name, value in vars(module).items()
        if isinstance(value, type) and value.__module__ == module.__name__
    )
    return ", ".join(names) or "none"


def load_class(classpath: str, where: str = "") -> Any:
    """The class (or factory) named by ``classpath``; ``where`` prefixes every error."""
    module_part, attr = split_classpath(classpath, where)
    if module_part.endswith(".py") or "/" in module_part:
        module = _import_file(Path(module_part), where)
    else:
        module = _import_module(module_part, where, classpath)
    not_a_class = (
        f"{where}{classpath!r} is not a class path: it names a module; "
        f"add the class ({CLASSPATH_FORMS})"
    )
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            if ":" not in classpath and _is_module(classpath):
                raise RewardError(not_a_class)
            raise RewardError(
                f"{where}{classpath!r}: {module_part!r} has no attribute {attr!r} "
                f"(the classes it defines: {_defined_classes(module)})"
            )
        obj = getattr(obj, part)
    if isinstance(obj, ModuleType):
        raise RewardError(not_a_class)
    if not callable(obj):
        raise RewardError(f"{where}{classpath!r} is a {type(obj).__name__}, not a class")
    return obj


def load_processor(
    classpath: str,
    options: dict[str, Any] | None = None,
    where: str = "",
    kind: str = "reward processor",
) -> Any:
    """An instance of the ``kind`` class at ``classpath``, built with ``options`` as keywords."""
    cls = load_class(classpath, where)
    try:
        instance = cls(**(options or {}))
    except (TypeError, ValueError) as exc:
        given = ", ".join(sorted(options or {})) or "no options"
        raise RewardError(f"{where}{classpath} cannot be built with {given}: {exc}") from exc
    if not callable(getattr(instance, "process", None)):
        raise RewardError(f"{where}{classpath} has no process() method: not a {kind}")
    return instance
