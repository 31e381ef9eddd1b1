"""Load a processor class from a ``module:Class`` or ``path/to/file.py:Class`` path."""

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

CLASSPATH_FORMS = "package.module:Class or path/to/file.py:Class"


def _cwd_on_path() -> None:
    """Modules are looked up from the working directory too, as ``python -m`` does."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _import_file(path: Path, where: str) -> ModuleType:
    if not path.is_file():
        raise RewardError(f"{where}{path}: no such file")
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


def _import_module(dotted: str, where: str) -> ModuleType:
    _cwd_on_path()
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if dotted == missing or dotted.startswith(missing + "."):
            raise RewardError(
                f"{where}no module named {missing!r} (for {dotted!r}); run from the directory "
                "that holds it, put it on PYTHONPATH, or give a file path: path/to/file.py:Class"
            ) from exc
        raise RewardError(f"{where}importing {dotted!r} failed: {exc}") from exc
    except Exception as exc:
        raise RewardError(
            f"{where}importing {dotted!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def load_class(classpath: str, where: str = "") -> Any:
    """The class (or factory) named by ``classpath``; ``where`` prefixes every error."""
    module_part, sep, attr = classpath.partition(":")
    if not sep or not module_part or not attr:
        raise RewardError(f"{where}{classpath!r} is not a class path ({CLASSPATH_FORMS})")
    if module_part.endswith(".py") or "/" in module_part:
        module = _import_file(Path(module_part), where)
    else:
        module = _import_module(module_part, where)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardError(f"{where}{module_part!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardError(f"{where}{classpath!r} is a {type(obj).__name__}, not a class")
    return obj


def load_processor(classpath: str, options: dict[str, Any] | None = None, where: str = "") -> Any:
    """An instance of the processor class at ``classpath``, built with ``options`` as keywords."""
    cls = load_class(classpath, where)
    try:
        instance = cls(**(options or {}))
    except (TypeError, ValueError) as exc:
        given = ", ".join(sorted(options or {})) or "no options"
        raise RewardError(f"{where}{classpath} cannot be built with {given}: {exc}") from exc
    if not callable(getattr(instance, "process", None)):
        raise RewardError(f"{where}{classpath} has no process() method: not a reward processor")
    return instance
