"""gzip record batches at a chosen level, for both Kafka client libraries.

aiokafka 0.14 and kafka-python 3.0 compress a gzip batch with
``gzip.GzipFile(compresslevel=9)`` and take no level option. Level 9 costs
about 3.5 times the CPU of zlib's default level 6 for batches about 4%
smaller (produce FILE's events: 15.8 s against 4.4 s per 100,000 events on
two cores), and zlib's compression is most of what `turnstream produce` and
`turnstream replay` spend with gzip. librdkafka (so kcat) and the Java client
default to level 6. :func:`use_gzip_level` puts a ``gzip_encode`` that
compresses at TURNSTREAM_PRODUCER_GZIP_LEVEL in place of the one the batch
builders' modules imported; any gzip reader reads the result.

It checks the installed versions first: an untested version is a clear error
here, not a silent change of behaviour. Tested by tests/kafka/test_produce.py
(batches written at each level, read back by kcat and both libraries).

Can go when both libraries take a gzip level (the Java client's
``compression.gzip.level``, KIP-390).
"""

from __future__ import annotations

import importlib
import zlib
from typing import Any

from pipeline.errors import ConfigError
from pipeline.library_versions import require_tested

TESTED = {"aiokafka": ("0.12.", "0.13.", "0.14."), "kafka-python": ("3.0.",)}
BUILDERS = {  # per library, the modules whose batch builder calls the global name gzip_encode
    "aiokafka": ("aiokafka.record._crecords.default_records", "aiokafka.record.default_records"),
    "kafka-python": ("kafka.record.default_records",),
}
GZIP = 31  # zlib's wbits for a gzip stream (header and trailer)
_level: int | None = None
_patched: set[str] = set()  # the libraries whose builders use gzip_encode


def gzip_encode(payload: Any, compresslevel: int | None = None) -> bytes:
    """A gzip stream of ``payload`` at the level in use (or ``compresslevel``)."""
    return zlib.compress(payload, compresslevel or _level or 6, wbits=GZIP)


def check_versions(library: str) -> None:
    require_tested(
        {library: TESTED[library]},
        "TURNSTREAM_PRODUCER_GZIP_LEVEL (pipeline/broker/gzip_level.py)",
        "tests/kafka/test_produce.py",
    )


def use_gzip_level(level: int, library: str) -> None:
    """From now on, ``library``'s clients (``aiokafka`` or ``kafka-python``) in this process
    gzip their batches at ``level`` (1-9). Only that library is imported, so a process that
    uses one does not load the other."""
    global _level
    if library not in _patched:
        check_versions(library)
        for name in BUILDERS[library]:
            module = importlib.import_module(name)
            if not hasattr(module, "gzip_encode"):
                raise ConfigError(f"{name} has no gzip_encode to replace: extend gzip_level.py")
            setattr(module, "gzip_encode", gzip_encode)  # noqa: B010 (a module global, by name)
        _patched.add(library)
    _level = level
