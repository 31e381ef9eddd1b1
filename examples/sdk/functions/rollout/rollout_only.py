"""A rollout with tools: the policy is asked until it answers without calling one.

The guide registers this class (``functions.rollout.rollout_only.DemoRolloutProcessor``)
without showing it; this one goes through every branch of ``trace_client`` and
``trace_tool``: a sync tool (``search``), an async one (``weather``), one that
raises (``stock_price``: the model is told what went wrong), and FAILED when the
policy cannot be reached. A rollout that uses up ``max_turns`` ends there, its
trajectory cut short.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from typing import Any

import openai

from pipeline.sdk import (
    AbstractRolloutProcessor,
    AgentOutput,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
    trace_client,
    trace_tool,
)


def search(query: str) -> str:
    return f"3 results for {query!r}"


async def weather(query: str) -> str:
    await asyncio.sleep(0)
    return "sunny, 21 C"


def stock_price(query: str) -> str:
    raise ConnectionError("the quote service is down")


TOOLS: dict[str, Callable[..., Any]] = {
    "search": search,
    "weather": weather,
    "stock_price": stock_price,
}
TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    for name in TOOLS
]


class DemoRolloutProcessor(AbstractRolloutProcessor):
    def setup(self) -> None:
        pass

    async def process(self, input: RolloutInput) -> RolloutOutput:
        tools = {name: trace_tool(input, fn) for name, fn in TOOLS.items()}
        messages = list(input.messages or [])
        try:
            async with trace_client(input) as client:
                for _ in range(input.sampling_params.max_turns):
                    completion = await client.chat.completions.create(
                        messages=messages, tools=input.tools or TOOL_SCHEMAS
                    )
                    message = completion.choices[0].message
                    messages.append(message.model_dump(exclude_none=True))
                    if not message.tool_calls:
                        break
                    for call in message.tool_calls:
                        messages.append(await call_tool(tools, call))
        except openai.APIError as exc:
            return RolloutOutput(
                agent_output=AgentOutput(messages=[]),
                status=TaskStatus.FAILED,
                error=f"LLM call failed: {exc}",
            )
        trace = input.trace
        return RolloutOutput(
            agent_output=AgentOutput(
                messages=messages,
                rollout_metrics={
                    "model_calls": float(len(trace.model_calls)),
                    "tool_errors": float(sum(not c.ok for c in trace.tool_calls)),
                },
            ),
            status=TaskStatus.SUCCESS,
        )


async def call_tool(tools: dict[str, Callable[..., Any]], call: Any) -> dict[str, Any]:
    """The tool message answering one tool call; a tool's error is its answer."""
    try:
        tool = tools[call.function.name]
        result = tool(**json.loads(call.function.arguments or "{}"))
        if inspect.isawaitable(result):
            result = await result
        content = str(result)
    except Exception as exc:  # the model reads what went wrong, as from any tool
        content = f"error: {type(exc).__name__}: {exc}"
    return {"role": "tool", "tool_call_id": call.id, "content": content}
