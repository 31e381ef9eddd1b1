from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # output waits


def test_help_lists_every_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("kafka", "topics", "produce", "worker", "retry", "schema", "demo", "learn"):
        assert command in result.output


def test_schema_export_writes_valid_json_schemas(tmp_path: Path) -> None:
    result = runner.invoke(app, ["schema", "export", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "turn.schema.json" in files and "sample.schema.json" in files
    turn = json.loads((tmp_path / "turn.schema.json").read_text())
    assert turn["properties"]["turn_type"]["enum"] == ["main", "side"]


def test_strimzi_export_needs_a_known_format() -> None:
    result = runner.invoke(app, ["topics", "export", "--format", "helm"])
    assert result.exit_code != 0 and "unknown format" in result.output


def test_strimzi_export_takes_the_profile_from_the_option_before_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yaml

    def replicas(*args: str) -> set[int]:
        result = runner.invoke(app, ["topics", "export", *args])
        assert result.exit_code == 0, result.output
        return {doc["spec"]["replicas"] for doc in yaml.safe_load_all(result.output)}

    monkeypatch.delenv("TURNSTREAM_TOPICS_FILE", raising=False)
    monkeypatch.delenv("TURNSTREAM_TOPICS_PROFILE", raising=False)
    assert replicas() == {1}
    assert replicas("--profile", "cluster") == {3}
    monkeypatch.setenv("TURNSTREAM_TOPICS_PROFILE", "cluster")
    assert replicas() == {3}
    monkeypatch.setenv("TURNSTREAM_TOPICS_PROFILE", "nope")
    assert replicas("--profile", "cluster") == {3}
    result = runner.invoke(app, ["topics", "export", "--profile", "clustr"])
    assert result.exit_code != 0
    assert "no profile 'clustr'; the profiles it declares: cluster" in str(result.exception)


def test_worker_flags_are_checked_before_anything_starts() -> None:
    import pytest

    from pipeline.cli.worker import settings_with_scoring
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=r"needs at least one URL.*--judge-url"):
        settings_with_scoring({"judge": "sglang"})
    with pytest.raises(ConfigError, match="early_stop is defined for m=3"):
        settings_with_scoring({"vote_mode": "early_stop", "m": 5})
    ok = settings_with_scoring({"judge": "openai", "judge_urls": ["http://127.0.0.1:9"], "m": 5})
    assert ok.scoring.m == 5 and ok.scoring.judge == "openai"


def test_worker_web_host_and_port_flags_reach_its_settings(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pipeline.scoring.worker

    started = []
    monkeypatch.delenv("TURNSTREAM_SCORING_WEB_HOST", raising=False)
    monkeypatch.setattr(
        pipeline.scoring.worker, "run_worker", lambda settings, loglevel: started.append(settings)
    )
    result = runner.invoke(app, ["worker", "--web-host", "0.0.0.0", "--web-port", "16066"])
    assert result.exit_code == 0, result.output
    assert (started[0].scoring.web_host, started[0].scoring.web_port) == ("0.0.0.0", 16066)
    runner.invoke(app, ["worker"])
    assert started[1].scoring.web_host == "127.0.0.1"


def test_deepspeed_launcher_local_rank_argument_is_taken(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os

    from pipeline.cli import _take_local_rank

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    argv = ["turnstream", "--local_rank=1", "train", "--config", "c.yaml"]
    assert _take_local_rank(argv) == ["turnstream", "train", "--config", "c.yaml"]
    assert os.environ["LOCAL_RANK"] == "1"


@pytest.mark.parametrize(("code", "rc", "err"), [(None, 0, ""), (3, 3, ""), ("bad", 1, "bad\n")])
def test_a_quick_exit_keeps_the_exit_code_the_output_and_the_atexit_handlers(
    code: object, rc: int, err: str
) -> None:
    script = (
        "import atexit, sys; from pipeline.cli import _quick_exit; "
        "atexit.register(lambda: print(' and its atexit handler')); "
        f"sys.stdout.write('buffered output'); _quick_exit({code!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=BUFFERED
    )
    assert done.returncode == rc
    assert done.stdout == "buffered output and its atexit handler\n"
    assert done.stderr == err


def test_a_quick_exit_into_a_closed_pipe_is_python_s_exit_120_without_a_traceback() -> None:
    script = (
        "import os, sys; from pipeline.cli import _quick_exit; "
        "sys.stdout.write('x' * 100); os.close(sys.stdout.fileno()); _quick_exit(None)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=BUFFERED
    )
    assert (done.returncode, done.stderr) == (120, "")


def test_a_bulk_command_run_as_a_process_ends_quickly_with_its_output() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "replay", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Copy a range of one topic into another" in done.stdout
