"""Code that leans on a library's internals runs only on the versions it was tested with."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping

from pipeline.errors import ConfigError


def require_tested(
    tested: dict[str, tuple[str, ...]],
    what: str,
    tests: str,
    installed: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The installed versions of ``tested``'s packages; ConfigError naming ``what`` and the
    ``tests`` to re-run when one matches none of its version prefixes. ``installed`` names
    versions to check in place of the installed ones (the tests' other versions)."""
    found = {}
    for package, prefixes in tested.items():
        if installed is not None and package in installed:
            version = installed[package]
        else:
            version = importlib.metadata.version(package)
        if not version.startswith(prefixes):
            raise ConfigError(
                f"{package} {version} is installed, but {what} was tested with "
                f"{', '.join(prefixes)}x only: install a tested version (pip install -e .) or "
                f"re-run the kafka tests of {tests} and extend TESTED"
            )
        found[package] = version
    return found
