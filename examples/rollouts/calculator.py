"""A rollout with a calculator tool: the policy answers an arithmetic question.

The task is a ``RolloutInput`` whose ``messages`` ask the question and whose
``ground_truth`` is the answer (``examples/rollouts/calculator_tasks.jsonl``).
The policy may call one tool, ``calculate``, by writing on a line of its reply

    CALL calculate(<expression>)

(the first such call in a reply counts). SmolLM2-135M-Instruct's chat template
drops ``tools=`` and ``turnstream serve`` returns no ``tool_calls``, so the
call is plain text, and a system prompt with a worked example teaches the form
(``PREAMBLE``, put before a task that has no system message of its own). The
tool's result, or what was wrong with the call, goes back to the policy as a
``tool`` message (the next state of the turn that called it); a reply without
a call is the final answer. At most ``sampling_params.max_turns`` model calls
are made: a rollout whose last allowed reply is still a call ends there,
unanswered. ``rollout_metrics``: ``model_calls``, ``tool_calls`` (calls
answered), ``tool_errors`` (those answered with an error),
``max_turns_reached`` (no answer) and ``correct`` (the
answer holds the ground truth as a whole word, case-insensitive: the
project's rule, ``pipeline.learn.prompts.holds_answer``).

    turnstream rollout test --processor examples.rollouts.calculator:CalculatorRollout \\
        --input task.json --model-url http://127.0.0.1:30001/v1
"""

from __future__ import annotations

import ast
import copy
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from pipeline.learn.prompts import holds_answer
from pipeline.sdk import (
    AbstractRolloutProcessor,
    AgentOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
    trace_client,
    trace_tool,
)

TOOL = "calculate"
DEFAULT_MAX_TOKENS = 96  # a reply's bound when the task sets no max_tokens
PREAMBLE: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a careful assistant with a calculator. To use the calculator, "
        "reply with one line: CALL calculate(<expression>). The result comes back as a "
        "tool message. Then reply with the final answer.",
    },
    {"role": "user", "content": "What is 25 * 4?"},
    {"role": "assistant", "content": "CALL calculate(25 * 4)"},
    {"role": "tool", "name": TOOL, "content": "25 * 4 = 100"},
    {"role": "assistant", "content": "The answer is 100."},
]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 1e15  # of every intermediate result, so that no power grows without bound
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_CALL = re.compile(r"\bCALL\b[ \t]*(.*)")  # the rest of the line after CALL
_NAME = re.compile(r"([A-Za-z_]\w*)\s*\(")


class CalculatorError(ValueError):
    """An expression the calculator refuses, and why."""


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, ``+ - * / // % **`` (or ``^``), parentheses.

    The expression is parsed with ``ast`` and walked; nothing is ever passed to
    ``eval``, and any other syntax (names, calls, attributes) is refused.
    """
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression.strip()!r}") from None
    return _value(tree.body)


def _value(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"an exponent above {MAX_EXPONENT} is refused")
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("the result is too large") from None
    raise CalculatorError(
        f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.unparse(node)!r}"
    )


def _checked(value: Any) -> int | float:
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if not abs(value) <= MAX_MAGNITUDE:  # also catches inf and nan
        raise CalculatorError(f"the result is larger than {MAX_MAGNITUDE:g}")
    return value


def format_number(value: int | float) -> str:
    """``12`` for 12 and 12.0, ``0.3333333333`` for 1/3: ten significant digits at most."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int) else f"{value:.10g}"


def calculate(expression: str) -> str:
    """The calculator tool: the expression's value as text."""
    return format_number(evaluate(expression))


@dataclass(frozen=True)
class ToolRequest:
    """A call the policy wrote: the tool's name and its argument, as text."""

    name: str
    argument: str


def parse_call(text: str) -> ToolRequest | None:
    """The first ``CALL name(argument)`` in ``text``, or None when no line has ``CALL``.

    The argument runs to the parenthesis that closes the call, or to the end of
    its line when none does; quotes around it are dropped. A ``CALL`` not
    followed by ``name(`` is a request with no name (answered with the form).
    """
    line = _CALL.search(text)
    if line is None:
        return None
    rest = line.group(1)
    head = _NAME.match(rest)
    if head is None:
        return ToolRequest("", rest.strip())
    start, end, depth = head.end(), len(rest), 1
    for i in range(start, len(rest)):
        depth += {"(": 1, ")": -1}.get(rest[i], 0)
        if depth == 0:
            end = i
            break
    argument = rest[start:end].strip()
    if len(argument) >= 2 and argument[0] == argument[-1] and argument[0] in "'\"":
        argument = argument[1:-1].strip()
    return ToolRequest(head.group(1), argument)


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def final_answer(messages: list[dict[str, Any]]) -> str | None:
    """The last assistant message's text, or None when there is none or it is a tool call."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is None or parse_call(text_of(last)) is not None:
        return None
    return text_of(last)


def answers_of(ground_truth: Any) -> list[str]:
    """The ground truth as answers to look for: 12.0 as "12"; a list gives each of its items."""
    items = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    return [
        format_number(g) if isinstance(g, int | float) and not isinstance(g, bool) else str(g)
        for g in items
        if g is not None
    ]


def is_right(messages: list[dict[str, Any]], ground_truth: Any) -> bool:
    """The final answer holds the ground truth as a whole word, ignoring case."""
    return holds_answer(final_answer(messages), answers_of(ground_truth))


def tool_message(tool: Callable[[str], str], request: ToolRequest) -> tuple[dict[str, Any], bool]:
    """The tool message that answers ``request``, and whether the call worked."""
    if not request.name:
        error = f"error: write a call as CALL {TOOL}(<expression>)"
        return {"role": "tool", "name": TOOL, "content": error}, False
    if request.name != TOOL:
        error = f"error: there is no tool named {request.name!r}; call {TOOL}(<expression>)"
        return {"role": "tool", "name": request.name, "content": error}, False
    try:
        result = f"{request.argument} = {tool(request.argument)}"
        return {"role": "tool", "name": TOOL, "content": result}, True
    except CalculatorError as exc:
        return {"role": "tool", "name": TOOL, "content": f"error: {exc}"}, False


def conversation(input: RolloutInput) -> list[dict[str, Any]]:
    """The task's messages, after ``PREAMBLE`` unless the task opens with a system message."""
    messages = copy.deepcopy(input.messages)
    if messages and messages[0].get("role") == "system":
        return messages
    return [*copy.deepcopy(PREAMBLE), *messages]


class CalculatorRollout(AbstractRolloutProcessor):
    """Ask, run each call the policy writes, give it the result, until it answers."""

    def setup(self) -> None:
        pass

    async def process(self, input: RolloutInput) -> RolloutOutput:
        tool = trace_tool(input, calculate)
        messages = conversation(input)
        limits = {} if input.sampling_params.max_tokens else {"max_tokens": DEFAULT_MAX_TOKENS}
        max_turns = input.sampling_params.max_turns
        calls = errors = 0
        try:
            async with trace_client(input) as client:
                for turn in range(1, max_turns + 1):
                    completion = await client.chat.completions.create(messages=messages, **limits)
                    reply = completion.choices[0].message.model_dump(exclude_none=True)
                    messages.append(reply)
                    request = parse_call(text_of(reply))
                    if request is None or turn == max_turns:
                        break
                    result, ok = tool_message(tool, request)
                    messages.append(result)
                    calls, errors = calls + 1, errors + (not ok)
        except openai.APIError as exc:
            return RolloutOutput(status=TaskStatus.FAILED, error=f"LLM call failed: {exc}")
        answer = final_answer(messages)
        metrics = {
            "model_calls": float(len(input.trace.model_calls)),
            "tool_calls": float(calls),
            "tool_errors": float(errors),
            "max_turns_reached": float(answer is None),
        }
        if input.ground_truth is not None:
            metrics["correct"] = float(is_right(messages, input.ground_truth))
        return RolloutOutput(
            agent_output=AgentOutput(messages=messages, rollout_metrics=metrics),
            status=TaskStatus.SUCCESS,
        )
