"""`turnstream reward test` and `turnstream judge agreement`, through the real CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rewards"

FLAKY = """
from pipeline.rewards import RewardOutput

class Flaky:
    def setup(self):
        pass

    async def process(self, input):
        text = (input.next_state.content if input.next_state else "") or ""
        if "timeout" in text:
            return RewardOutput.failed("judge timed out")
        if "boom" in text:
            raise KeyError("boom")
        return RewardOutput.success(1.0)
"""


@pytest.fixture(autouse=True)
def rules_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default judge is whatever the settings say: make it the offline rules judge."""
    for name in ("TURNSTREAM_SCORING_JUDGE", "TURNSTREAM_SCORING_JUDGE_URLS", "TURNSTREAM_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def flaky(tmp_path: Path) -> str:
    path = tmp_path / "flaky.py"
    path.write_text(FLAKY)
    return f"{path}:Flaky"


def write_input(tmp_path: Path, next_content: str) -> Path:
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"next_state": {"role": "user", "content": next_content}}))
    return path


def test_help_answers_for_both_commands() -> None:
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "reward" in top.output and "judge" in top.output
    result = runner.invoke(app, ["reward", "test", "--help"])
    assert result.exit_code == 0
    for text in ("--processor", "--input", "--config", "--options", "FAILED"):
        assert text in result.output
    result = runner.invoke(app, ["judge", "agreement", "--help"])
    assert result.exit_code == 0
    for text in ("--gold", "--processor", "--min-rho", "--min-kappa", "Spearman"):
        assert text in result.output


def test_reward_test_prints_the_seed_decorator_output() -> None:
    result = runner.invoke(
        app,
        [
            "reward",
            "test",
            "--processor",
            "examples.rewards.refusal:SafetyProcessor",
            "--input",
            str(EXAMPLES / "reward_decorator_input.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["status"] == "success" and out["error"] is None
    assert out["reward"]["reward_score"] == pytest.approx(0.85)


def test_reward_test_runs_a_group_processor_on_a_group_input() -> None:
    result = runner.invoke(
        app,
        [
            "reward",
            "test",
            "--processor",
            "examples/rewards/group.py:DemoGroupRewardProcessor",
            "--input",
            str(EXAMPLES / "group_reward_input.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert [r["reward_score"] for r in json.loads(result.stdout)["reward"]["rewards"]] == [0.5]


def test_reward_test_with_a_rewards_file_runs_its_group_entry_on_a_group_input() -> None:
    args = ["reward", "test", "--input", str(EXAMPLES / "group_reward_input.json"), "--config"]
    result = runner.invoke(app, [*args, str(EXAMPLES / "rewards-group.yaml")])
    assert result.exit_code == 0, result.output
    assert [r["reward_score"] for r in json.loads(result.stdout)["reward"]["rewards"]] == [0.5]
    result = runner.invoke(app, [*args, str(EXAMPLES / "rewards.yaml")])
    assert result.exit_code == 2 and "the file has no group:" in result.output


def test_reward_test_with_a_rewards_file_and_options(tmp_path: Path) -> None:
    turn_input = str(EXAMPLES / "reward_turn_input.json")
    result = runner.invoke(
        app, ["reward", "test", "--config", str(EXAMPLES / "rewards.yaml"), "--input", turn_input]
    )
    assert result.exit_code == 0, result.output
    # safety 1.0 * 0.4 + quality (0.2 * rule 1 + 0.8 * judge 1 for "Thanks, that works!") * 0.6
    assert json.loads(result.stdout)["reward"]["reward_score"] == pytest.approx(1.0)
    result = runner.invoke(
        app,
        [
            "reward",
            "test",
            "--processor",
            "examples.rewards.rules:ResponseRule",
            "--options",
            '{"max_chars": 5}',
            "--input",
            turn_input,
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reward"]["reward_metrics"]["within_length"] == 0.0


def test_a_failed_output_exits_1_with_its_error(tmp_path: Path, flaky: str) -> None:
    result = runner.invoke(
        app,
        ["reward", "test", "--processor", flaky, "--input", str(write_input(tmp_path, "timeout"))],
    )
    assert result.exit_code == 1
    assert json.loads(result.stdout)["status"] == "failed"
    assert "Flaky FAILED: judge timed out" in result.stderr

    result = runner.invoke(
        app, ["reward", "test", "--processor", flaky, "--input", str(write_input(tmp_path, "boom"))]
    )
    assert result.exit_code == 1 and "Flaky raised KeyError" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processor", "no_such_pkg.mod:X"], "no module named 'no_such_pkg'"),
        (["--processor", "examples.rewards.refusal"], "is not a class path"),
        (["--processor", "examples.rewards.refusal:Nope"], "has no attribute 'Nope'"),
        (
            ["--processor", "examples.rewards.rules:ResponseRule", "--options", "{max"],
            "--options is not valid JSON",
        ),
        ([], "give exactly one of --processor"),
    ],
)
def test_a_bad_processor_exits_2_with_a_clear_message(args: list[str], message: str) -> None:
    input_path = str(EXAMPLES / "reward_input.json")
    result = runner.invoke(app, ["reward", "test", *args, "--input", input_path])
    assert result.exit_code == 2, result.output
    assert message in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"agent_output": {"mesages": []}}', "agent_output.mesages: unknown field"),
        ('{"next_state": {"role": "robot"}}', "next_state.role"),
    ],
)
def test_a_bad_input_file_exits_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "in.json"
    path.write_text(content)
    result = runner.invoke(
        app,
        [
            "reward",
            "test",
            "--processor",
            "examples.rewards.demo:DemoRewardProcessor",
            "--input",
            str(path),
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_judge_agreement_on_the_gold_set_gives_the_hand_computed_rho_and_kappa() -> None:
    result = runner.invoke(app, ["judge", "agreement", "--gold", str(EXAMPLES / "gold.jsonl")])
    assert result.exit_code == 0, result.output
    # gold labels:             [1, -1, 1, -1, 0, 0,  1, 1, -1, 1]
    # rules judge (default):   [1, -1, 1, -1, 0, 0, -1, 1, -1, 0]
    #   line 7 "Completed: 0 failed, 120 passed" reads as a tool error; line 10 is ambiguous
    # kappa: p_o = 8/10; gold 1:5 -1:3 0:2, judge 1:3 -1:4 0:3
    #   p_e = (5*3 + 3*4 + 2*3) / 100 = 0.33; kappa = (0.8 - 0.33) / 0.67 = 0.70149
    kappa = (0.8 - 0.33) / 0.67
    # rho on average ranks: gold -1 -> 2, 0 -> 4.5, 1 -> 8; judge -1 -> 2.5, 0 -> 6, 1 -> 9
    #   centred (mean 5.5): sum of products 50.5, sxx 70, syy 73.5
    rho = 50.5 / math.sqrt(70 * 73.5)
    assert "processor: prm: rules judge" in result.stdout
    assert f"Spearman rho: {rho:.4f}" in result.stdout and f"{rho:.4f}" == "0.7040"
    assert f"Cohen kappa:  {kappa:.4f}" in result.stdout and f"{kappa:.4f}" == "0.7015"
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[-3:]}
    assert rows == {"-1": ["3", "0", "0"], "0": ["0", "2", "0"], "1": ["1", "1", "3"]}

    result = runner.invoke(
        app, ["judge", "agreement", "--gold", str(EXAMPLES / "gold.jsonl"), "--min-kappa", "0.8"]
    )
    assert result.exit_code == 1 and "kappa 0.7015 is below --min-kappa 0.8" in result.stderr


def test_judge_agreement_leaves_failed_inputs_out_and_exits_1(tmp_path: Path, flaky: str) -> None:
    gold = tmp_path / "gold.jsonl"
    lines = [
        {"label": 1, "next_state": {"role": "user", "content": "fine"}},
        {"label": 0, "next_state": {"role": "user", "content": "timeout"}},
        {"label": 1, "next_state": {"role": "user", "content": "ok"}},
    ]
    gold.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = runner.invoke(app, ["judge", "agreement", "--gold", str(gold), "--processor", flaky])
    assert result.exit_code == 1
    assert "scored: 2   failed: 1" in result.stdout
    assert "FAILED line 2: judge timed out" in result.stdout
    assert "1 input(s) FAILED" in result.stderr


def test_a_bad_gold_file_names_each_bad_line(tmp_path: Path) -> None:
    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        '{"label": 1, "next_state": {"role": "user", "content": "ok"}}\n'
        '{"next_state": {"role": "user", "content": "ok"}}\n'
        "\n"
        '{"label": "good"}\n'
        "{oops\n"
    )
    result = runner.invoke(app, ["judge", "agreement", "--gold", str(gold)])
    assert result.exit_code == 2
    for where in (
        "gold.jsonl:2: label: expected a number",
        "gold.jsonl:4: label",
        "gold.jsonl:5: not valid JSON",
    ):
        assert where in result.stderr
