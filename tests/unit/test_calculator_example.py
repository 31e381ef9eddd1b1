"""The calculator rollout example: its evaluator, its tool-call form, its reward, and its tool
loop driven against the policy simulator (scripted replies)."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest

from examples.rollouts.calculator import (
    PREAMBLE,
    CalculatorError,
    CalculatorRollout,
    ToolRequest,
    calculate,
    evaluate,
    parse_call,
)
from examples.rollouts.calculator_reward import CalculatorReward
from pipeline.rewards import AgentOutput, RewardInput, TaskStatus
from pipeline.rollouts import RolloutInput, run_rollout
from pipeline.rollouts.tasks import read_tasks
from pipeline.testing.policy_sim import PolicySimulator
from tests.conftest import REPO
from tests.rollout_helpers import policy_simulator

__all__ = ["policy_simulator"]  # fixtures

TASKS = REPO / "examples" / "rollouts" / "calculator_tasks.jsonl"


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17 * 23", "391"),
        ("(15 + 9) * 3", "72"),
        ("144 / 12", "12"),  # an integral quotient reads as an integer
        ("7 / 4", "1.75"),
        ("1 / 3", "0.3333333333"),
        ("2 ** 10", "1024"),
        ("2^10", "1024"),  # ^ is a power, as people write it
        ("-3 + +5", "2"),
        ("10 // 3 + 10 % 4", "5"),
        (" 1_000 - 1 ", "999"),
        ("12 × 3 ÷ 4", "9"),
    ],
)
def test_the_calculator_computes_arithmetic(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("__import__('os').system('true')", "only numbers"),
        ("x + 1", "not 'x'"),
        ("abs(-3)", "not 'abs(-3)'"),
        ("(1).real", "only numbers"),
        ("True + 1", "not 'True'"),
        ("'1' + '2'", "only numbers"),
        ("[1, 2]", "only numbers"),
        ("1 +", "not an arithmetic expression"),
        ("", "not an arithmetic expression"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("2 ** 65", "an exponent above 64"),
        ("10 ** 16", "larger than 1e+15"),
        ("(10 ** 8) * (10 ** 8)", "larger than 1e+15"),
        ("(-8) ** 0.5", "not a real number"),
        ("1e308 * 10", "larger than 1e+15"),
        ("1" + " + 1" * 100, "longer than 200 characters"),
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression: str, why: str) -> None:
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert why in str(caught.value)


def test_the_calculator_never_evaluates_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_eval(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("eval was called")

    monkeypatch.setattr(builtins, "eval", no_eval)
    monkeypatch.setattr(builtins, "exec", no_eval)
    assert calculate("(128 - 39) * (17 + 6)") == "2047"
    target = tmp_path / "written"
    with pytest.raises(CalculatorError):
        evaluate(f"open({str(target)!r}, 'w')")
    assert not target.exists()


@pytest.mark.parametrize(
    ("text", "request_"),
    [
        ("CALL calculate(17 * 23)", ToolRequest("calculate", "17 * 23")),
        (
            "Let me see.\nCALL calculate((15 + 9) * 3) and then",
            ToolRequest("calculate", "(15 + 9) * 3"),
        ),
        ('CALL calculate("1 + 2")', ToolRequest("calculate", "1 + 2")),
        ("CALL calculate(1 + (2\nmore", ToolRequest("calculate", "1 + (2")),  # to its line's end
        ("CALL add(38, 47)  # sum", ToolRequest("add", "38, 47")),
        ("CALL 17 * 23", ToolRequest("", "17 * 23")),  # no name: answered with the form
        ("CALL calculate(1)\nCALL calculate(2)", ToolRequest("calculate", "1")),  # the first
        ("The answer is 391.", None),
        ("RECALL that 2 + 2 = 4", None),
        ("call calculate(1 + 1)", None),  # the form is CALL, in capitals
    ],
)
def test_a_tool_call_is_a_line_that_writes_call(text: str, request_: ToolRequest | None) -> None:
    assert parse_call(text) == request_


def rewarded(ground_truth: Any, *replies: str) -> tuple[float, dict[str, float]]:
    """The reward of a trajectory whose assistant replies are ``replies``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 17 * 23?"}]
    for reply in replies:
        messages += [{"role": "assistant", "content": reply}, {"role": "tool", "content": "391"}]
    messages.pop()
    out = CalculatorReward().process(
        RewardInput(agent_output=AgentOutput(messages=messages), ground_truth=ground_truth)
    )
    assert out.status is TaskStatus.SUCCESS and out.reward is not None
    return out.score, out.reward.reward_metrics


def test_the_reward_is_1_when_the_final_answer_holds_the_ground_truth_as_a_word() -> None:
    assert rewarded("391", "CALL calculate(17 * 23)", "The answer is 391.")[0] == 1.0
    assert rewarded("391", "391")[0] == 1.0
    assert rewarded(391, "It is 391")[0] == 1.0  # a number as ground truth
    assert rewarded(12.0, "It is 12.")[0] == 1.0  # 12.0 is looked for as 12
    assert rewarded("Twelve", "twelve!")[0] == 1.0  # ignoring case
    assert rewarded("391", "It is 3910")[0] == 0.0  # not as a whole word
    assert rewarded("391", "It is x391")[0] == 0.0
    assert rewarded("391", "The answer is 392.")[0] == 0.0
    assert rewarded("-3", "It is 3")[0] == 0.0


def test_the_reward_reads_only_the_final_answer_and_a_call_is_none() -> None:
    score, metrics = rewarded("391", "The answer is 391.", "Sorry, it is 400.")
    assert score == 0.0 and metrics["answered"] == 1.0  # right earlier, wrong at the end
    score, metrics = rewarded("391", "CALL calculate(391)")  # cut short at max_turns
    assert (score, metrics["answered"], metrics["correct"]) == (0.0, 0.0, 0.0)
    score, metrics = rewarded(None, "The answer is 391.")
    assert (score, metrics["has_ground_truth"]) == (0.0, 0.0)
    assert rewarded("391")[0] == 0.0  # no assistant message at all


def task(url: str, max_turns: int = 4, **sampling: Any) -> RolloutInput:
    return RolloutInput.model_validate(
        {
            "messages": [{"role": "user", "content": "What is 17 * 23?"}],
            "ground_truth": "391",
            "sampling_params": {"max_turns": max_turns, "temperature": 1.0, **sampling},
            "model_resource": {"model_name": "policy-sim", "base_url": url},
        }
    )


def after_preamble(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    assert messages[: len(PREAMBLE)] == PREAMBLE
    return [(m["role"], m["content"]) for m in messages[len(PREAMBLE) :]]


async def test_the_rollout_calls_the_tool_and_answers(
    policy_simulator: tuple[PolicySimulator, str],
) -> None:
    sim, url = policy_simulator
    sim.replies += ["CALL calculate(17 * 23)", "The answer is 391."]
    rollout = task(url)
    out = await run_rollout(CalculatorRollout(), rollout)
    assert out.status is TaskStatus.SUCCESS
    assert after_preamble(out.agent_output.messages) == [
        ("user", "What is 17 * 23?"),
        ("assistant", "CALL calculate(17 * 23)"),
        ("tool", "17 * 23 = 391"),
        ("assistant", "The answer is 391."),
    ]
    assert out.agent_output.rollout_metrics == {
        "model_calls": 2.0,
        "tool_calls": 1.0,
        "tool_errors": 0.0,
        "max_turns_reached": 0.0,
        "correct": 1.0,
    }
    (call,) = rollout.trace.tool_calls
    assert (call.name, call.arguments, call.result, call.ok) == (
        "calculate",
        {"expression": "17 * 23"},
        "391",
        True,
    )
    # the tool's result is the last message of the next model call: the turn's next state
    first, second = sim.requests
    assert second["messages"][-1] == {
        "role": "tool",
        "name": "calculate",
        "content": "17 * 23 = 391",
    }
    assert first["messages"][0]["role"] == "system"
    assert (first["temperature"], first["max_tokens"]) == (1.0, 96)  # the default bound


async def test_a_tool_error_goes_back_to_the_policy(
    policy_simulator: tuple[PolicySimulator, str],
) -> None:
    sim, url = policy_simulator
    sim.replies += ["CALL calculate(17 / 0)", "CALL sum(17, 23)", "CALL calculate(17*23)", "391"]
    rollout = task(url, max_tokens=40)
    out = await run_rollout(CalculatorRollout(), rollout)
    assert out.status is TaskStatus.SUCCESS
    tools = [c for r, c in after_preamble(out.agent_output.messages) if r == "tool"]
    assert tools == [
        "error: division by zero",
        "error: there is no tool named 'sum'; call calculate(<expression>)",
        "17*23 = 391",
    ]
    metrics = out.agent_output.rollout_metrics or {}
    assert (metrics["tool_calls"], metrics["tool_errors"], metrics["correct"]) == (3.0, 2.0, 1.0)
    # only the calculator is a traced tool; its error is recorded with the call
    errors = [c.error for c in rollout.trace.tool_calls]
    assert errors == ["CalculatorError: division by zero", None]
    assert sim.requests[1]["messages"][-1]["content"] == "error: division by zero"
    assert {r["max_tokens"] for r in sim.requests} == {40}  # the task's own bound


async def test_the_rollout_stops_at_max_turns_unanswered(
    policy_simulator: tuple[PolicySimulator, str],
) -> None:
    sim, url = policy_simulator
    sim.replies += ["CALL calculate(1 + 1)", "CALL calculate(391)", "391"]
    out = await run_rollout(CalculatorRollout(), task(url, max_turns=2))
    assert out.status is TaskStatus.SUCCESS
    assert sim.chat_calls == 2 and sim.replies == ["391"]  # never asked a third time
    assert after_preamble(out.agent_output.messages)[-1] == ("assistant", "CALL calculate(391)")
    metrics = out.agent_output.rollout_metrics or {}
    assert (metrics["max_turns_reached"], metrics["tool_calls"], metrics["correct"]) == (
        1.0,
        1.0,
        0.0,
    )


async def test_the_rollout_fails_when_the_policy_cannot_be_reached(
    policy_simulator: tuple[PolicySimulator, str],
) -> None:
    sim, url = policy_simulator
    sim.config.chat_fail_first = 100
    out = await run_rollout(CalculatorRollout(), task(url))
    assert out.status is TaskStatus.FAILED
    assert out.error is not None and out.error.startswith("LLM call failed: ")


def test_the_task_file_holds_mixed_tasks_each_with_its_ground_truth() -> None:
    tasks = read_tasks(TASKS)
    assert len(tasks) >= 20 and len({t.task_id for t in tasks}) == len(tasks)
    assert {t.input.rollout_extra["difficulty"] for t in tasks} == {"easy", "medium", "hard"}
    for t in tasks:
        # the ground truth is the calculator's value of the task's expression
        assert t.input.ground_truth == calculate(t.input.rollout_extra["expression"]), t.source
        assert t.input.messages[-1]["role"] == "user", t.source
        assert t.input.sampling_params.temperature == 1.0
        assert t.input.sampling_params.max_turns >= 2
