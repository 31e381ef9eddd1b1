"""`turnstream rollout test`, through the real CLI: the guide's task file, the policy simulator.

The task file is the guide's, unchanged: it names a public endpoint, and every
run here points it at the simulator with --model-url instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.rollouts import RolloutInput
from pipeline.rollouts.run import on_model
from pipeline.testing.policy_sim import PolicySimulator
from tests.rollout_helpers import TASK, app_in_thread, in_sdk, processors

__all__ = ["in_sdk", "processors"]  # fixtures

runner = CliRunner()
DEMO = "functions.rollout.rollout_only.DemoRolloutProcessor"
PUBLIC = "https://dashscope.aliyuncs.com/compatible-mode/v1"


@pytest.fixture
def simulator() -> Iterator[tuple[PolicySimulator, str]]:
    """The policy simulator served from a thread (the command runs its own loop); its /v1 URL."""
    sim = PolicySimulator()
    with app_in_thread(sim.app()) as url:
        yield sim, f"{url}/v1"


def rollout_test(*args: str) -> object:
    return runner.invoke(app, ["rollout", "test", *args])


def task_file(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "task.json"
    path.write_text(json.dumps({**json.loads(TASK.read_text()), **changes}))
    return path


def test_help_lists_the_commands_and_their_options() -> None:
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "rollout" in top.output and "functions" in top.output
    result = runner.invoke(app, ["rollout", "test", "--help"])
    assert result.exit_code == 0
    for text in ("--processor", "--input", "--model-url", "--model-name", "FAILED"):
        assert text in result.output
    result = runner.invoke(app, ["rollout", "serve", "--help"])
    assert result.exit_code == 0 and "--port" in result.output and "/rollout" in result.output


def test_the_guides_rollout_on_the_guides_task_answers_through_the_simulator(
    in_sdk: Path, simulator: tuple[PolicySimulator, str]
) -> None:
    sim, url = simulator
    result = rollout_test(
        "--processor", DEMO, "--input", "resources/rollout_input.json",
        "--model-url", url, "--model-name", "policy-under-test",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "success" and out["error"] is None
    assert out["agent_output"]["messages"] == [
        {"role": "user", "content": "Hello, please introduce yourself"},
        {"role": "assistant", "content": "Here is my answer to: Hello, please introduce yourself"},
    ]
    assert out["agent_output"]["rollout_metrics"] == {"model_calls": 1.0, "tool_errors": 0.0}
    # the simulator was asked, for the model named on the command line, with the task's sampling
    assert [(b["model"], b["temperature"], b["max_tokens"]) for b in sim.requests] == [
        ("policy-under-test", 0.7, 1024)
    ]
    assert "1 model call(s), 0 tool call(s) traced" in result.stderr


def test_a_new_model_url_does_not_carry_the_tasks_key_to_it() -> None:
    task = RolloutInput.model_validate(json.loads(TASK.read_text()))
    assert task.model_resource.base_url == PUBLIC
    local = on_model(task, "http://127.0.0.1:1/v1")
    assert local.model_resource.base_url == "http://127.0.0.1:1/v1"
    assert local.model_resource.api_key == "" and local.model_resource.model_name == "qwen3.5-9b"
    keyed = on_model(task, "http://127.0.0.1:1/v1", "m", "sk-local")
    assert (keyed.model_resource.model_name, keyed.model_resource.api_key) == ("m", "sk-local")
    assert on_model(task) is task and task.model_resource.api_key == "your-api-key-here"


def test_a_failed_output_is_printed_and_exits_1(processors: str) -> None:
    result = rollout_test("--processor", f"{processors}:Refuses", "--input", str(TASK))
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert (out["status"], out["error"]) == ("failed", "the quote service is down")
    assert "Refuses FAILED: the quote service is down" in result.stderr


def test_a_rollout_past_its_timeout_is_failed_with_the_timeout(
    tmp_path: Path, processors: str
) -> None:
    path = task_file(tmp_path, sampling_params={"timeout": 0.2})
    result = rollout_test("--processor", f"{processors}:Sleeps", "--input", str(path))
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["status"] == "failed"
    assert out["error"] == "timed out after 0.2 s (sampling_params.timeout)"


def test_an_exception_in_process_is_failed_with_its_text_and_logged(
    processors: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="pipeline.rollouts.run")
    result = rollout_test("--processor", f"{processors}:Raises", "--input", str(TASK))
    assert result.exit_code == 1
    error = "Raises.process raised KeyError: 'no tool named stock_price'"
    assert json.loads(result.stdout)["error"] == error
    logged = [r for r in caplog.records if r.name == "pipeline.rollouts.run"]
    assert len(logged) == 1 and logged[0].exc_info is not None  # with its traceback


@pytest.mark.parametrize(
    ("classpath", "message"),
    [
        ("functions.rollout.nope.Demo", "no module named 'functions.rollout.nope'"),
        (
            "functions.reward.reward.DemoRewardProcessor",
            "listed as rollout, but it is a reward processor (it subclasses "
            "AbstractRewardProcessor)",
        ),
        ("functions/rollout/missing.py:Demo", "no such file"),
        ("functions.rollout.rollout_only", "it names a module; add the class"),
    ],
)
def test_a_class_that_cannot_be_used_exits_2(in_sdk: Path, classpath: str, message: str) -> None:
    result = rollout_test("--processor", classpath, "--input", str(TASK))
    assert result.exit_code == 2 and result.stdout == ""
    assert message in result.stderr


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("SetupRaises", "SetupRaises.setup() raised ConnectionError: the sandbox is not reachable"),
        ("AsyncSetup", "AsyncSetup.setup() must be a plain def"),
        ("NoInput", "its process() does not take one input"),
    ],
)
def test_a_processor_that_cannot_start_exits_2(processors: str, name: str, message: str) -> None:
    result = rollout_test("--processor", f"{processors}:{name}", "--input", str(TASK))
    assert result.exit_code == 2 and message in result.stderr


def test_an_input_file_that_is_no_task_exits_2_naming_the_file_and_the_field(
    tmp_path: Path, processors: str
) -> None:
    path = task_file(tmp_path, sampling_params={"timeout": 0}, messages="hello")
    result = rollout_test("--processor", f"{processors}:Refuses", "--input", str(path))
    assert result.exit_code == 2
    assert f"{path}: not a RolloutInput:" in result.stderr
    assert "sampling_params.timeout: Input should be greater than 0" in result.stderr
    assert "messages: Input should be a valid list" in result.stderr
    path.write_text('{"messages": [')
    result = rollout_test("--processor", f"{processors}:Refuses", "--input", str(path))
    assert result.exit_code == 2 and f"{path}: not valid JSON" in result.stderr
    missing = tmp_path / "nope.json"
    result = rollout_test("--processor", f"{processors}:Refuses", "--input", str(missing))
    assert result.exit_code == 2 and f"{missing}: cannot read" in result.stderr
