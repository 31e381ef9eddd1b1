"""gzip record batches at TURNSTREAM_PRODUCER_GZIP_LEVEL, in both client libraries' builders."""

from __future__ import annotations

import gzip
import random
import subprocess
import sys

import pytest
from aiokafka.record.default_records import DefaultRecordBatch
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaPythonBuilder

from pipeline.broker import gzip_level
from pipeline.settings import Settings

GZIP = 1  # the record batch attribute of gzip


def values(n: int = 300) -> list[bytes]:
    rng = random.Random(7)
    words = [b"session", b"assistant", b"content", b"tool", b"reply", b"turn", b"json"]
    return [
        b" ".join(rng.choice(words) + b"%d" % rng.randrange(99) for _ in range(60))
        for _ in range(n)
    ]


def aiokafka_batch() -> bytes:
    builder = AioBuilder(2, GZIP, False, -1, -1, -1, 1 << 22)
    for i, value in enumerate(values()):
        builder.append(i, timestamp=None, key=b"k%d" % i, value=value, headers=[])
    return bytes(builder.build())


def kafka_python_batch() -> bytes:
    builder = KafkaPythonBuilder(2, GZIP, False, -1, -1, -1, 1 << 22)
    for i, value in enumerate(values()):
        builder.append(i, timestamp=None, key=b"k%d" % i, value=value, headers=[])
    return bytes(builder.build())


@pytest.fixture(autouse=True)
def default_level_after():  # type: ignore[no-untyped-def]
    yield
    for library in gzip_level.BUILDERS:
        gzip_level.use_gzip_level(Settings().producer_gzip_level, library)


@pytest.mark.parametrize(
    ("library", "build"), [("aiokafka", aiokafka_batch), ("kafka-python", kafka_python_batch)]
)
def test_the_level_in_use_decides_each_batchs_size(library, build) -> None:  # type: ignore[no-untyped-def]
    sizes = {}
    for level in (1, 6, 9):
        gzip_level.use_gzip_level(level, library)
        sizes[level] = len(build())
    assert sizes[1] > sizes[6] >= sizes[9]  # level 1 is the largest: the level is used


def test_a_batch_at_any_level_reads_back_whole() -> None:
    gzip_level.use_gzip_level(1, "aiokafka")
    records = list(DefaultRecordBatch(aiokafka_batch()))
    assert [r.value for r in records] == values()
    assert gzip.decompress(gzip_level.gzip_encode(b"abc" * 50)) == b"abc" * 50


def test_the_default_is_zlibs_and_librdkafkas_and_bad_levels_are_refused() -> None:
    assert Settings().producer_gzip_level == 6
    with pytest.raises(ValueError, match="producer_gzip_level"):
        Settings(producer_gzip_level=10)


def test_an_untested_client_version_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gzip_level, "_patched", set())
    monkeypatch.setitem(gzip_level.TESTED, "aiokafka", ("0.99.",))
    with pytest.raises(gzip_level.ConfigError, match=r"aiokafka 0\.14\.\d+ is installed"):
        gzip_level.use_gzip_level(3, "aiokafka")
    gzip_level.use_gzip_level(3, "kafka-python")  # the other library's check is its own


def test_a_library_is_imported_only_when_its_clients_are_used() -> None:
    code = (
        "import sys; from pipeline.broker import gzip_level; "
        "gzip_level.use_gzip_level(6, 'aiokafka'); "
        "print('kafka' in sys.modules, 'aiokafka' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
