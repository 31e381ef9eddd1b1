"""`turnstream functions check`: the guide's register_functions list, checked locally, and
every way an entry or the file can be wrong, through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.rollouts.components import declared_kinds
from pipeline.sdk import GroupRewardInput, RewardInput, RewardOutput
from tests.rollout_helpers import in_sdk, processors

__all__ = ["in_sdk", "processors"]  # fixtures

runner = CliRunner()

PLAIN = """
from pipeline.sdk import GroupRewardInput, GroupRewardOutput, RewardOutput

class GroupByAnnotation:
    def process(self, input: GroupRewardInput) -> GroupRewardOutput:
        raise AssertionError("never run")

class Unannotated:
    def process(self, input):
        return RewardOutput.success(1.0)

class Closing:
    def setup(self):
        open(__file__ + ".set-up", "w").close()

    async def close(self):
        open(__file__ + ".closed", "w").close()

    def process(self, input: "RewardInput") -> RewardOutput:
        raise AssertionError("never run")
"""


def check(path: Path | str) -> object:
    return runner.invoke(app, ["functions", "check", str(path)])


def test_the_guides_functions_all_load_and_set_up(in_sdk: Path) -> None:
    result = check("functions.yaml")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "ok      functions[0] rollout-only (rollout): "
        "functions.rollout.rollout_only.DemoRolloutProcessor",
        "ok      functions[1] reward (reward): functions.reward.reward.DemoRewardProcessor",
        "ok      functions[2] reward-decorator (reward): "
        "functions/reward/reward_decorator.py:SafetyProcessor",
        "ok      functions[3] group-reward (group_reward): "
        "functions.reward.group_reward.DemoGroupRewardProcessor",
        "functions.yaml: all 4 function(s) load and set up",
    ]


def test_each_bad_entry_is_named_with_what_is_wrong(
    in_sdk: Path, processors: str, tmp_path: Path
) -> None:
    path = tmp_path / "functions.yaml"
    path.write_text(
        f"""
- {{name: fine, type: rollout, classpath: functions.rollout.my_rollout:MyRolloutProcessor}}
- {{name: typo, type: reward, classpath: functions.reward.rewrad.DemoRewardProcessor}}
- {{type: rollout, classpath: functions.reward.reward.DemoRewardProcessor}}
- {{name: grouped, type: reward, classpath: functions.reward.group_reward.DemoGroupRewardProcessor}}
- {{name: sandbox, type: rollout, classpath: "{processors}:SetupRaises"}}
- {{name: async-setup, type: rollout, classpath: "{processors}:AsyncSetup"}}
- {{name: no-input, type: rollout, classpath: "{processors}:NoInput"}}
"""
    )
    result = check(path)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ok      [0] fine (rollout): ")
    expected = [
        "FAILED  [1] typo (reward): no module named 'functions.reward.rewrad'",
        "FAILED  [2] (rollout): functions.reward.reward.DemoRewardProcessor: listed as rollout, "
        "but it is a reward processor (it subclasses AbstractRewardProcessor)",
        "FAILED  [3] grouped (reward): functions.reward.group_reward.DemoGroupRewardProcessor: "
        "listed as reward, but it is a group reward processor",
        "FAILED  [4] sandbox (rollout): SetupRaises.setup() raised ConnectionError: "
        "the sandbox is not reachable",
        "FAILED  [5] async-setup (rollout): AsyncSetup.setup() must be a plain def",
        "FAILED  [6] no-input (rollout): ",
    ]
    assert len(lines) == 7
    for line, start in zip(lines[1:], expected, strict=True):
        assert line.startswith(start), line
    assert lines[6].endswith("its process() does not take one input")
    assert f"{path}: 6 of 7 function(s) cannot be used" in result.stderr


def test_the_kind_is_read_from_the_annotations_too(tmp_path: Path) -> None:
    module = tmp_path / "plain.py"
    module.write_text(PLAIN)
    path = tmp_path / "functions.yaml"
    path.write_text(
        f"""
functions:
  - {{type: reward, classpath: "{module}:GroupByAnnotation"}}
  - {{type: group_reward, classpath: "{module}:GroupByAnnotation"}}
  - {{type: rollout, classpath: "{module}:Unannotated"}}
  - {{type: reward, classpath: "{module}:Closing"}}
"""
    )
    result = check(path)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:4] == [
        f"FAILED  functions[0] (reward): {module}:GroupByAnnotation: listed as reward, but it is a "
        "group reward processor (its process() takes a GroupRewardInput)",
        f"ok      functions[1] (group_reward): {module}:GroupByAnnotation",
        f"ok      functions[2] (rollout): {module}:Unannotated",  # nothing says otherwise
        f"ok      functions[3] (reward): {module}:Closing",
    ]
    # what setup() acquired is released once checked
    assert Path(f"{module}.set-up").exists() and Path(f"{module}.closed").exists()


def test_declared_kinds_name_their_evidence() -> None:
    class Scorer:
        def process(self, input: RewardInput) -> RewardOutput:
            raise AssertionError

    class Group:
        def process(self, input: GroupRewardInput) -> None:
            raise AssertionError

    assert declared_kinds(Scorer()) == {"reward": "its process() takes a RewardInput"}
    assert declared_kinds(Group()) == {"group_reward": "its process() takes a GroupRewardInput"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("functions: [", "not valid YAML"),
        ("", "expected a list of functions (or functions: a list), got an empty file"),
        ("just a string", "expected a list of functions (or functions: a list), got a str"),
        ("functions: []", "functions: List should have at least 1 item"),
        (
            "- {type: rolout, classpath: a.B}\n- {type: reward}\n- {type: reward, classpath: a.B, "
            "weight: 2}",
            "[0].type: Input should be 'rollout', 'reward' or 'group_reward'\n{path}: "
            "[1].classpath: required key is missing\n{path}: [2].weight: unknown key",
        ),
        (
            "functions:\n  - {name: a, type: reward, classpath: a.B}\n"
            "  - {name: a, type: reward, classpath: a.C}",
            "(top level): name(s) used by more than one entry: a",
        ),
    ],
)
def test_a_file_that_cannot_be_used_exits_2(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "functions.yaml"
    path.write_text(text)
    result = check(path)
    assert result.exit_code == 2 and result.stdout == ""
    assert f"{path}: {message.format(path=path)}" in result.stderr
    result = check(tmp_path / "missing.yaml")
    assert result.exit_code == 2 and "missing.yaml: cannot read" in result.stderr
