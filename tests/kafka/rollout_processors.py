"""Rollout processors the rollout stage's Kafka-tier tests run, each task saying what to do.

``rollout_extra.kind`` picks the behaviour: ``chat`` (two model calls on a plain
``openai`` client of its own, the second, streamed, after the user's follow-up), ``tool``
(``trace_client`` and ``trace_tool``: the policy asks for a tool, its result
goes back to the policy), ``fail`` (a model call, then FAILED), ``slow`` (a
model call, then longer than the task's timeout), ``greedy`` (model calls until
the proxy refuses one: max_turns), ``burst`` (five model calls at once: those past
max_turns are refused even while the others are in flight), ``answer`` (as chat, its
AgentOutput ending with ``answer {index}``, the rollout's final answer for a reward),
``late`` (a call, then a second one left in flight as it returns), ``pause``
(``rollout_extra.pause_s`` asleep, then as ``chat``), ``hang_once`` (the first time: a
model call, then the attempt's run id written to the file ``rollout_extra.marker`` and
asleep until killed; after that, as ``chat``). :class:`FinalAnswer` is a group reward
on whole rollouts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai

from pipeline.sdk import (
    AgentOutput,
    GroupReward,
    GroupRewardInput,
    GroupRewardOutput,
    Reward,
    RolloutInput,
    RolloutOutput,
    TaskStatus,
    trace_client,
    trace_tool,
)

FOLLOW_UP = "thanks, that is what I needed"
SEARCH_RESULT = "3 results for the weather in Lisbon"
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


def search(query: str) -> str:
    return SEARCH_RESULT


def _client(input: RolloutInput) -> openai.AsyncOpenAI:
    """A client of the processor's own, on nothing but the task's model_resource."""
    resource = input.model_resource
    return openai.AsyncOpenAI(
        base_url=resource.base_url, api_key=resource.api_key or "none", max_retries=0
    )


async def _ask(
    client: Any, input: RolloutInput, messages: list[dict[str, Any]], stream: bool = False
) -> str:
    model = input.model_resource.model_name
    if not stream:
        completion = await client.chat.completions.create(model=model, messages=messages)
        return str(completion.choices[0].message.content)
    pieces = []
    async for chunk in await client.chat.completions.create(
        model=model, messages=messages, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    return "".join(pieces)


class ScriptedRollouts:
    def setup(self) -> None:
        pass

    async def process(self, input: RolloutInput) -> RolloutOutput:
        kind = input.rollout_extra["kind"]
        messages = list(input.messages)
        if kind == "tool":
            return await self._tool(input, messages)
        if kind == "burst":
            return await self._burst(input, messages)
        if kind == "late":
            return await self._late(input, messages)
        if kind == "pause":
            await asyncio.sleep(float(input.rollout_extra["pause_s"]))
        marker = Path(input.rollout_extra.get("marker", "-"))
        hang = kind == "hang_once" and not marker.exists()
        async with _client(input) as client:
            messages.append({"role": "assistant", "content": await _ask(client, input, messages)})
            if hang:  # a worker killed mid-task: its session has a turn and never ends
                marker.write_text(str(input.request_metadata["run_id"]))  # type: ignore[index]
                await asyncio.sleep(3600)
            if kind == "fail":
                return RolloutOutput(status=TaskStatus.FAILED, error="the tool broke")
            if kind == "slow":
                await asyncio.sleep(30)
            while kind == "greedy":  # until the proxy refuses a call (BadRequestError)
                messages += [{"role": "user", "content": "more"}]
                messages.append(
                    {"role": "assistant", "content": await _ask(client, input, messages)}
                )
            messages.append({"role": "user", "content": FOLLOW_UP})  # the last call streams
            answer = await _ask(client, input, messages, stream=True)
            messages.append({"role": "assistant", "content": answer})
        if kind == "answer":
            index = str(input.request_metadata["rollout_id"]).rsplit(":", 1)[1]  # type: ignore[index]
            messages.append({"role": "assistant", "content": f"answer {index}"})
        return RolloutOutput(
            agent_output=AgentOutput(messages=messages, rollout_metrics={"calls": 2.0}),
            status=TaskStatus.SUCCESS,
            rollout_metrics={"answer_words": float(len(messages[-1]["content"].split()))},
        )

    async def _tool(self, input: RolloutInput, messages: list[dict[str, Any]]) -> RolloutOutput:
        tool = trace_tool(input, search)
        async with trace_client(input) as client:
            first = await client.chat.completions.create(messages=messages, tools=[SEARCH_TOOL])
            call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
            messages.append(first.choices[0].message.model_dump(exclude_none=True))
            result = tool(**json.loads(call.function.arguments))  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            second = await client.chat.completions.create(messages=messages, tools=[SEARCH_TOOL])
            messages.append(second.choices[0].message.model_dump(exclude_none=True))
        return RolloutOutput(agent_output=AgentOutput(messages=messages), status=TaskStatus.SUCCESS)

    async def _late(self, input: RolloutInput, messages: list[dict[str, Any]]) -> RolloutOutput:
        """One call, then another left running as the rollout returns (it ends after)."""
        async with _client(input) as client:
            messages.append({"role": "assistant", "content": await _ask(client, input, messages)})
        task = asyncio.ensure_future(_late_call(input, messages))
        LATE.add(task)
        task.add_done_callback(LATE.discard)
        return RolloutOutput(agent_output=AgentOutput(messages=messages), status=TaskStatus.SUCCESS)

    async def _burst(self, input: RolloutInput, messages: list[dict[str, Any]]) -> RolloutOutput:
        async with _client(input) as client:
            got = await asyncio.gather(
                *(_ask(client, input, messages) for _ in range(5)), return_exceptions=True
            )
        refused = [g for g in got if isinstance(g, openai.BadRequestError)]
        served = [g for g in got if isinstance(g, str)]
        assert len(refused) + len(served) == len(got), got
        metrics = {"served": float(len(served)), "refused": float(len(refused))}
        return RolloutOutput(
            agent_output=AgentOutput(messages=messages, rollout_metrics=metrics),
            status=TaskStatus.SUCCESS,
        )


LATE: set[asyncio.Task[Any]] = set()  # the late kind's calls, kept alive


async def _late_call(input: RolloutInput, messages: list[dict[str, Any]]) -> None:
    async with _client(input) as client:
        await _ask(client, input, [*messages, {"role": "user", "content": "one more thing"}])


class FinalAnswer:
    """A group reward on whole rollouts: 1.0 for a rollout whose last message is the task's
    ground truth, else 0.0; ``messages`` counts each rollout's messages."""

    def setup(self) -> None:
        pass

    def process(self, input: GroupRewardInput) -> GroupRewardOutput:
        rewards = [
            Reward(
                reward_score=float(o.messages[-1].get("content") == input.ground_truth),
                reward_metrics={"messages": float(len(o.messages))},
            )
            for o in input.agent_outputs
        ]
        return GroupRewardOutput(reward=GroupReward(rewards=rewards), status=TaskStatus.SUCCESS)
