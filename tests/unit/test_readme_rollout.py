"""README's "Writing a rollout" code block runs as written: loaded as a module, its processor
driven against the policy simulator."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pipeline.rewards import TaskStatus
from pipeline.rollouts import RolloutInput, run_rollout
from pipeline.sdk import AbstractRolloutProcessor
from pipeline.testing.policy_sim import PolicySimulator
from tests.conftest import REPO
from tests.rollout_helpers import policy_simulator

__all__ = ["policy_simulator"]  # fixtures

HEADING = "### Writing a rollout"


def readme_block() -> str:
    """The first python code block under the heading."""
    readme = (REPO / "README.md").read_text()
    assert readme.count(HEADING + "\n") == 1, f"README.md has no single {HEADING!r} section"
    section = readme.split(HEADING + "\n", 1)[1].split("\n### ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"no python code block under {HEADING!r}"
    return found.group(1)


@pytest.fixture
def module(tmp_path: Path) -> ModuleType:
    path = tmp_path / "readme_rollout.py"
    path.write_text(readme_block())
    spec = importlib.util.spec_from_file_location("readme_rollout", path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def processor_of(module: ModuleType) -> Any:
    (cls,) = [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and issubclass(v, AbstractRolloutProcessor)
        and v.__module__ == module.__name__
    ]
    return cls()


def task(url: str, max_turns: int = 4) -> RolloutInput:
    return RolloutInput.model_validate(
        {
            "messages": [{"role": "user", "content": "Weather in Lisbon?"}],
            "sampling_params": {"max_turns": max_turns},
            "model_resource": {"model_name": "policy-sim", "base_url": url},
        }
    )


async def test_the_readme_rollout_calls_its_tool_and_answers(
    module: ModuleType, policy_simulator: tuple[PolicySimulator, str]
) -> None:
    sim, url = policy_simulator
    sim.replies += ["CALL weather(Lisbon)", "CALL forecast(Porto)", "Sunny in Lisbon."]
    rollout = task(url)
    out = await run_rollout(processor_of(module), rollout)
    assert out.status is TaskStatus.SUCCESS, out.error
    assert [(m["role"], m["content"]) for m in out.agent_output.messages] == [
        ("user", "Weather in Lisbon?"),
        ("assistant", "CALL weather(Lisbon)"),
        ("tool", "sunny, 21 C in Lisbon"),
        ("assistant", "CALL forecast(Porto)"),
        ("tool", "error: no tool 'forecast'"),
        ("assistant", "Sunny in Lisbon."),
    ]
    assert out.agent_output.rollout_metrics == {"tool_calls": 1.0}
    (call,) = rollout.trace.tool_calls
    assert (call.name, call.arguments, call.result) == (
        "weather",
        {"city": "Lisbon"},
        "sunny, 21 C in Lisbon",
    )
    assert len(rollout.trace.model_calls) == 3
    # each tool result is the last message of the next model call: its turn's next state
    assert sim.requests[1]["messages"][-1]["content"] == "sunny, 21 C in Lisbon"


async def test_the_readme_rollout_keeps_to_max_turns_and_fails_without_a_policy(
    module: ModuleType, policy_simulator: tuple[PolicySimulator, str]
) -> None:
    sim, url = policy_simulator
    sim.replies += ["CALL weather(Oslo)"] * 5
    out = await run_rollout(processor_of(module), task(url, max_turns=2))
    assert out.status is TaskStatus.SUCCESS and sim.chat_calls == 2
    sim.config.chat_fail_first = sim.chat_calls + 100
    out = await run_rollout(processor_of(module), task(url))
    assert out.status is TaskStatus.FAILED
    assert out.error is not None and out.error.startswith("LLM call failed: ")
