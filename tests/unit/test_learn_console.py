"""`turnstream learn --console` and `turnstream demo`: the console started beside the run, on
its broker and topics, and a console that does not start is a warning, not a failed run."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.errors import ConfigError, TurnstreamError
from pipeline.learn import stack
from pipeline.learn.options import DEMO_STEPS, LearnOptions, demo_options
from pipeline.learn.report import LearnReport
from pipeline.learn.run import LearnRun
from pipeline.processes import Children
from pipeline.settings import KafkaSettings, Settings

runner = CliRunner()
RUN = Settings(
    kafka=KafkaSettings(bootstrap_servers="127.0.0.1:19092"), topic_prefix="learnab12cd34."
)


def spawned_console(
    monkeypatch: pytest.MonkeyPatch, port: int | None, tokenizer: Path | None = None
) -> tuple[list[str], dict[str, str], stack.Served]:
    """The command line and environment start_console spawns the console with (nothing
    starts: spawn_cli and the wait for /api/status are replaced)."""
    spawned: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(stack, "spawn_cli", lambda args, env, log: spawned.append((args, env)))
    monkeypatch.setattr(stack, "wait_http_ok", lambda *args: None)
    served = stack.start_console(RUN, Path("/tmp/run"), port, tokenizer)
    [(args, env)] = spawned
    return args, env, served


def test_the_console_reads_the_runs_broker_and_topics_at_the_port_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its command line, run through the CLI, reaches run_console with the run's broker,
    topic prefix, host and port: read-only, no tokenizer in rl."""
    import pipeline.console.run

    args, env, served = spawned_console(monkeypatch, 18181)
    assert served.url == "http://127.0.0.1:18181/"
    started: list[tuple[Settings, str, int, bool, Path | None]] = []
    monkeypatch.setattr(pipeline.console.run, "run_console", lambda *a: started.append(a))
    kafka_env = {k: env[k] for k in ("KAFKA_BOOTSTRAP_SERVERS", "TURNSTREAM_TOPIC_PREFIX")}
    result = runner.invoke(app, args, env=kafka_env)
    assert result.exit_code == 0, result.output
    [(settings, host, port, reviews, tokenizer)] = started
    assert settings.bootstrap_servers == "127.0.0.1:19092"
    assert settings.topic_prefix == "learnab12cd34."
    assert settings.topics.samples_scored.name == "learnab12cd34.samples.scored"
    assert (host, port, reviews, tokenizer) == ("127.0.0.1", 18181, False, None)


def test_the_console_port_defaults_to_the_consoles_setting_and_0_picks_a_free_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stack, "port_in_use", lambda host, port: False)
    args, _env, served = spawned_console(monkeypatch, None, Path("/models/policy"))
    assert args[args.index("--port") + 1] == "8080" and served.url.endswith(":8080/")
    assert args[args.index("--tokenizer") + 1] == "/models/policy"
    args, _env, _served = spawned_console(monkeypatch, 0)
    assert args[args.index("--port") + 1] not in ("0", "8080") and "--tokenizer" not in args


def test_a_port_in_use_is_refused_before_a_console_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned: list[Any] = []
    monkeypatch.setattr(stack, "spawn_cli", lambda *args: spawned.append(args))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(TurnstreamError, match=f"port {port} on 127.0.0.1 is in use"):
            stack.start_console(RUN, Path("/tmp/run"), port, None)
    assert spawned == []


def bare_run(tmp_path: Path, options: LearnOptions) -> tuple[LearnRun, Console]:
    """A LearnRun with only what its console step uses (no model, broker or processes)."""
    run = LearnRun.__new__(LearnRun)
    out = Console(record=True, width=200)
    run.settings, run.options, run.console, run.workdir = RUN, options, out, tmp_path
    run.model = tmp_path / "policy"
    run.report = LearnReport(options.to_json(), "p")
    run.children = Children()
    return run, out


def test_the_run_keeps_the_console_and_records_its_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[int | None, Path | None]] = []

    def fake(settings: Settings, workdir: Path, port: int | None, tok: Path | None) -> Any:
        calls.append((port, tok))
        return stack.Served("console-proc", f"http://127.0.0.1:{port}/")  # type: ignore[arg-type]

    monkeypatch.setattr("pipeline.learn.run.start_console", fake)
    run, out = bare_run(tmp_path, LearnOptions(console=True, console_port=18182, mode="opd"))
    run._console()
    assert calls == [(18182, tmp_path / "policy")]  # opd: its tokens shown as text
    assert run.children.procs == ["console-proc"]
    assert run.report.to_json()["console_url"] == "http://127.0.0.1:18182/"
    assert "console: http://127.0.0.1:18182/" in out.export_text()
    off, _out = bare_run(tmp_path, LearnOptions())
    off._console()
    assert off.children.procs == [] and off.report.to_json()["console_url"] is None


def test_a_console_that_does_not_start_is_a_warning_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refused(*args: Any) -> Any:
        raise TurnstreamError("port 8080 on 127.0.0.1 is in use: give --console-port")

    monkeypatch.setattr("pipeline.learn.run.start_console", refused)
    run, out = bare_run(tmp_path, LearnOptions(console=True))
    run._console()
    text = out.export_text()
    assert "warning: the console did not start, the run goes on without it" in text
    assert "8080 on 127.0.0.1 is in use" in text
    assert run.children.procs == [] and run.report.console_url is None


def test_learn_and_demo_pass_the_console_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import pipeline.cli.learn

    monkeypatch.setattr(signal, "signal", lambda *args: None)  # demo's SIGTERM handler

    got: list[LearnOptions] = []
    monkeypatch.setattr(pipeline.cli.learn, "run_and_report", lambda o, what: got.append(o))
    assert runner.invoke(app, ["learn", "--console", "--console-port", "0"]).exit_code == 0
    assert runner.invoke(app, ["learn"]).exit_code == 0
    assert runner.invoke(app, ["demo", "--console-port", "9999"]).exit_code == 0
    assert runner.invoke(app, ["demo", "--no-console"]).exit_code == 0
    assert [(o.console, o.console_port) for o in got] == [
        (True, 0),
        (False, None),
        (True, 9999),
        (False, None),
    ]
    demo = demo_options(Path("d"))
    assert demo.console is True
    # the demo is learn shortened: fewer steps, no control, version 8 evaluated on the way
    assert (demo.steps, demo.control, demo.eval_every) == (DEMO_STEPS, False, 8)
    assert LearnOptions().steps > DEMO_STEPS
    with pytest.raises(ConfigError, match=r"console_port \(--console-port\) 70000"):
        LearnOptions(console_port=70000)
    helped = runner.invoke(app, ["learn", "--help"])
    assert "--console-port" in helped.output and "turnstream console" in helped.output
