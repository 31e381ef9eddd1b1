"""Where settings come from, and naming that place when one is wrong.

The base of every settings class (:class:`EnvThenFile`: its environment variables, then
the YAML settings file), the file as a pydantic-settings source, the variable or YAML key
a validation error is about, and the warning about ``TURNSTREAM_*`` variables nothing
reads. A section of the file is read by the class a root settings class holds under that
name (``scoring:`` by ``Settings.scoring``'s class); the root class
(``pipeline.settings.Settings``) is an argument where errors are named, so this module
needs nothing from pipeline.settings, which imports it.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, YamlConfigSettingsSource

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from pydantic import ValidationError

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DATA = Path(__file__).resolve().parent / "_data"

# The name of the module processes load their settings through (load_settings), so that one
# logger configures every message about settings.
log = logging.getLogger("pipeline.settings")

# TURNSTREAM_* variables read with os.environ rather than through a settings class, and who
# reads them: they are not typos, so load_settings does not warn about them.
READ_DIRECTLY = {
    "TURNSTREAM_CONFIG": "pipeline/settings_sources.py (the YAML settings file)",
    "TURNSTREAM_TEST_HOLD": "tests/kafka/fault_worker.py",
    "TURNSTREAM_TEST_MARK": "tests/kafka/fault_worker.py",
    "TURNSTREAM_SOAK_TURNS": "tests/kafka/test_soak.py",
    "TURNSTREAM_FAULT_TURNS": "tests/kafka/test_faults.py",
}


def shipped_file(repo_relative: str, packaged_name: str) -> Path:
    """A file that lives in the repo checkout, or in the wheel's package data."""
    in_repo = REPO_ROOT / repo_relative
    return in_repo if in_repo.exists() else PACKAGE_DATA / packaged_name


def config_path() -> str | None:
    """The YAML settings file, read from the environment each time settings are."""
    return os.environ.get("TURNSTREAM_CONFIG")


class EnvThenFile(BaseSettings):
    """Settings read from their environment variables, then from the TURNSTREAM_CONFIG file."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, *config_file(settings_cls, config_path()))


@cache
def sections(root: type[BaseSettings]) -> dict[str, type[BaseSettings]]:
    """The sections of the YAML file: the fields of root that are settings classes."""
    return {
        name: info.annotation
        for name, info in root.model_fields.items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseSettings)
    }


def _settings_classes(base: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
    for sub in base.__subclasses__():
        yield sub
        yield from _settings_classes(sub)


def section_of(settings_cls: type[BaseSettings]) -> str | None:
    """The YAML key ``settings_cls`` is read from: the name of the field that holds it in
    another settings class (``scoring`` for ``Settings.scoring``); None for a root class."""
    for holder in _settings_classes(EnvThenFile):
        for name, cls in sections(holder).items():
            if cls is settings_cls:
                return name
    return None


def config_file(
    settings_cls: type[BaseSettings], path: str | None
) -> tuple[PydanticBaseSettingsSource, ...]:
    """The YAML file at path as a source of settings_cls; none while no path is given."""
    if not path:
        return ()
    if not Path(path).expanduser().is_file():  # pydantic-settings skips a missing file
        raise ConfigError(f"TURNSTREAM_CONFIG={path}: cannot read settings: no such file")
    return (_ConfigFile(settings_cls, path),)


class _ConfigFile(YamlConfigSettingsSource):
    """The part of the YAML file one class reads: a root class its top level, a section class
    its own mapping (``scoring: {m: 5}``), beneath that class's environment variables.

    Handed to the root as a dict, a section would be validated without the section's own
    sources, and ``scoring: {m: 5}`` would beat TURNSTREAM_SCORING_M.
    """

    def __init__(self, settings_cls: type[BaseSettings], path: str):
        self.path = path
        self.sections = sections(settings_cls)
        self.section = section_of(settings_cls)
        if self.section is None and not self.sections:
            raise ConfigError(
                f"TURNSTREAM_CONFIG={path}: {settings_cls.__name__} is no section of it, as no "
                "settings class holds it as a field: give pipeline.settings.Settings one, or "
                "import the class from pipeline.settings so that Settings is defined"
            )
        super().__init__(settings_cls, yaml_file=Path(path))

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        import yaml

        try:
            data = super()._read_file(file_path)
        except (OSError, UnicodeError, yaml.YAMLError) as exc:
            raise ConfigError(
                f"TURNSTREAM_CONFIG={self.path}: cannot read settings: {exc}"
            ) from exc
        if not isinstance(data, dict):
            raise ConfigError(f"TURNSTREAM_CONFIG={self.path}: expected a mapping at the top level")
        # Keys match fields whatever their case, as pydantic-settings matches them.
        data = {str(key).lower(): value for key, value in data.items()}
        if self.section is None:
            return {key: value for key, value in data.items() if key not in self.sections}
        part = data.get(self.section)
        if part is not None and not isinstance(part, dict):
            raise ConfigError(
                f"TURNSTREAM_CONFIG={self.path}: {self.section} must be a mapping of "
                f"setting: value, not {part!r}"
            )
        return {str(key): value for key, value in (part or {}).items()}


def validation_problems(
    exc: ValidationError, root: type[BaseSettings], overrides: dict[str, Any], config: str | None
) -> str:
    """Each error of exc, named by its variable or its key in the YAML file at config."""
    return "; ".join(
        _unknown_key(exc.title, e["loc"], root, overrides, config)
        if e["type"] == "extra_forbidden"
        else f"{_variable(exc.title, e['loc'], root, overrides, config)}: "
        f"{e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors(include_url=False)
    )


def _classes(root: type[BaseSettings]) -> dict[str, type[BaseSettings]]:
    """root and its section classes by name (the title of their ValidationError)."""
    classes: list[type[BaseSettings]] = [root, *sections(root).values()]
    return {cls.__name__: cls for cls in classes}


def _yaml_key(model: str, loc: tuple[int | str, ...], root: type[BaseSettings]) -> list[str]:
    """The key path in the YAML file of a field of root or of a section class."""
    section = next((name for name, cls in sections(root).items() if cls.__name__ == model), None)
    return [section, *map(str, loc)] if section else [str(part) for part in loc]


def _in_file(key: list[str], overrides: dict[str, Any], config: str | None) -> str | None:
    """The YAML file a key was read from: config, unless load_settings was given the key."""
    return None if key[0] in overrides else config


def _unknown_key(
    model: str,
    loc: tuple[int | str, ...],
    root: type[BaseSettings],
    overrides: dict[str, Any],
    config: str | None,
) -> str:
    """A key that is no setting: where it was given, and the settings beside it."""
    key = _yaml_key(model, loc, root)
    owner = root if len(key) == 1 else sections(root).get(key[0]) if len(key) == 2 else None
    where = _in_file(key, overrides, config) or "the arguments of load_settings"
    problem = f"{'.'.join(key)} in {where} is not a setting"
    if owner is None:
        return problem
    siblings = sorted(owner.model_fields)
    parent = f"{key[0]}." if len(key) == 2 else ""
    close = difflib.get_close_matches(key[-1], siblings, n=3)
    if close:
        problem += f"; did you mean {' or '.join(parent + name for name in close)}?"
    return f"{problem} ({parent.rstrip('.') or 'the top level'} has: {', '.join(siblings)})"


def _variable(
    model: str,
    loc: tuple[int | str, ...],
    root: type[BaseSettings],
    overrides: dict[str, Any],
    config: str | None,
) -> str:
    """Where a field was set: its variable (``TURNSTREAM_SCORING_M``) when the environment has
    it, else its key in the YAML file when one is named, else its path."""
    cls = _classes(root).get(model)
    if cls is None or len(loc) != 1:
        return ".".join(str(part) for part in (model, *loc))
    variable = f"{cls.model_config.get('env_prefix', '')}{loc[0]}".upper()
    key = _yaml_key(model, loc, root)
    in_file = _in_file(key, overrides, config)
    if in_file and variable not in _environment():
        return f"{'.'.join(key)} in {in_file}"
    return variable


def _environment() -> dict[str, str]:
    """The process environment by upper-case name, as pydantic-settings matches names."""
    return {name.upper(): name for name in os.environ}


def variables_read_by(root: type[BaseSettings]) -> set[str]:
    """Every environment variable root and its sections read (a section's JSON one included)."""
    names = set()
    for cls in _classes(root).values():
        prefix = cls.model_config.get("env_prefix", "")
        for name, info in cls.model_fields.items():
            alias = info.validation_alias or info.alias
            names.add((alias if isinstance(alias, str) else f"{prefix}{name}").upper())
    return names


# Variables already warned about. Written and read by warn_unknown_variables only (called by
# load_settings); two threads loading settings at once may both warn about one variable, which
# is harmless.
_warned: set[str] = set()


def warn_unknown_variables(root: type[BaseSettings]) -> None:
    """Warn, once a process, about each TURNSTREAM_* variable that nothing reads."""
    known = variables_read_by(root) | set(READ_DIRECTLY)
    for upper, name in sorted(_environment().items()):
        if not upper.startswith("TURNSTREAM_") or upper in known or upper in _warned:
            continue
        _warned.add(upper)
        close = _close_variables(upper, known)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        log.warning("%s is set but is not a setting, so it is ignored%s", name, hint)


def _close_variables(name: str, known: set[str]) -> list[str]:
    """Known TURNSTREAM_* variables near name, compared after the prefix they all share."""
    rest = name.removeprefix("TURNSTREAM_")
    candidates = [k.removeprefix("TURNSTREAM_") for k in known if k.startswith("TURNSTREAM_")]
    return ["TURNSTREAM_" + c for c in difflib.get_close_matches(rest, candidates, n=3, cutoff=0.8)]
