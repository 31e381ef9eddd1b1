"""trace_tool, trace_client and observe_processor: what each call leaves in the trace,
the metrics and the log."""

from __future__ import annotations

import asyncio
import copy
import logging
import pickle
from typing import Any

import openai
import pytest
from prometheus_client import REGISTRY

from pipeline.errors import RolloutError
from pipeline.rewards import RewardInput, RewardOutput
from pipeline.sdk import (
    AbstractRewardProcessor,
    ModelCall,
    RolloutInput,
    TaskStatus,
    observe_processor,
    trace_client,
    trace_tool,
)
from pipeline.testing.policy_sim import PolicySimulator
from tests.rollout_helpers import policy_simulator

__all__ = ["policy_simulator"]  # a fixture


def task(base_url: str = "", **sampling: Any) -> RolloutInput:
    return RolloutInput.model_validate(
        {
            "messages": [{"role": "user", "content": "hello there"}],
            "model_resource": {"model_name": "policy", "base_url": base_url, "api_key": "sk-1"},
            "sampling_params": sampling,
        }
    )


def lookup(city: str, units: str = "metric") -> str:
    return f"{city}: 21 {units}"


async def slow_lookup(city: str, delay: float) -> str:
    await asyncio.sleep(delay)
    return city.upper()


def broken(city: str) -> str:
    raise ValueError(f"no data for {city}")


async def broken_async(city: str) -> str:
    raise TimeoutError("the service did not answer")


def test_a_sync_tool_is_recorded_with_its_arguments_by_name() -> None:
    rollout = task()
    tool = trace_tool(rollout, lookup)
    assert tool("Porto", units="imperial") == "Porto: 21 imperial"
    assert tool(city="Lisbon") == "Lisbon: 21 metric"
    first, second = rollout.trace.tool_calls
    assert (first.index, first.name, first.arguments, first.result, first.error) == (
        0,
        "lookup",
        {"city": "Porto", "units": "imperial"},
        "Porto: 21 imperial",
        None,
    )
    assert (second.index, second.arguments, second.ok) == (1, {"city": "Lisbon"}, True)
    assert first.duration_s >= 0 and tool.__name__ == "lookup"


async def test_async_tools_are_recorded_in_the_order_they_started() -> None:
    rollout = task()
    tool = trace_tool(rollout, slow_lookup, name="city_lookup")
    # the first call finishes last; the trace lists calls by when they started
    results = await asyncio.gather(tool("porto", 0.05), tool("lisbon", 0.0))
    assert results == ["PORTO", "LISBON"]
    assert [(c.index, c.name, c.result) for c in rollout.trace.tool_calls] == [
        (0, "city_lookup", "PORTO"),
        (1, "city_lookup", "LISBON"),
    ]


async def test_a_raising_tool_records_the_exception_text_and_raises_it() -> None:
    rollout = task()
    with pytest.raises(ValueError, match="no data for Faro"):
        trace_tool(rollout, broken)("Faro")
    with pytest.raises(TimeoutError):
        await trace_tool(rollout, broken_async)(city="Braga")
    with pytest.raises(TypeError):
        trace_tool(rollout, lookup)("a", "b", "c")  # does not bind: kept as given
    calls = rollout.trace.tool_calls
    assert [(c.name, c.result, c.error, c.ok) for c in calls] == [
        ("broken", None, "ValueError: no data for Faro", False),
        ("broken_async", None, "TimeoutError: the service did not answer", False),
        ("lookup", None, calls[2].error, False),
    ]
    assert calls[2].arguments == {"*args": ["a", "b", "c"]}
    assert calls[2].error is not None and calls[2].error.startswith("TypeError: ")


def test_a_copy_of_a_task_is_another_rollout_and_a_pickle_keeps_the_calls() -> None:
    rollout = task()
    trace_tool(rollout, lookup)("Porto")
    for other in (rollout.model_copy(), rollout.model_copy(deep=True), copy.copy(rollout)):
        assert other.trace is not rollout.trace and other.trace.calls == []
    assert pickle.loads(pickle.dumps(rollout)).trace.calls == rollout.trace.calls


async def test_the_traced_client_asks_the_tasks_policy_and_records_each_completion(
    policy_simulator: tuple[PolicySimulator, str],
) -> None:
    sim, url = policy_simulator
    rollout = task(url, temperature=0.3, max_tokens=64, top_k=5, timeout=7.5)
    async with trace_client(rollout) as client:
        assert isinstance(client, openai.AsyncOpenAI)
        assert (client.api_key, str(client.base_url), client.timeout) == ("sk-1", url + "/", 7.5)
        messages: list[Any] = list(rollout.messages)
        first = await client.chat.completions.create(messages=messages)
        messages += [first.choices[0].message, {"role": "user", "content": "and again"}]
        await client.chat.completions.create(messages=messages, temperature=0.9, model="other")
    assert [b["model"] for b in sim.requests] == ["policy", "other"]
    assert [(b["temperature"], b["max_tokens"], b["top_k"]) for b in sim.requests] == [
        (0.3, 64, 5),
        (0.9, 64, 5),
    ]
    one, two = rollout.trace.model_calls
    assert isinstance(one, ModelCall) and one.index == 0 and two.index == 1
    assert one.messages == [{"role": "user", "content": "hello there"}]
    assert one.response == {"role": "assistant", "content": "Here is my answer to: hello there"}
    assert (one.model, one.params, one.finish_reason) == (
        "policy",
        {"temperature": 0.3, "max_tokens": 64},
        "stop",
    )
    assert one.usage == {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}
    # the message object appended as it came back is recorded as the dict it stands for
    assert two.messages[1] == one.response and two.model == "other"
    assert two.params["temperature"] == 0.9
    messages.append({"role": "user", "content": "changed after the call"})
    assert len(two.messages) == 3


async def test_the_sync_traced_client_records_the_same(
    policy_simulator: tuple[PolicySimulator, str],
) -> None:
    _sim, url = policy_simulator
    rollout = task(url)
    with trace_client(rollout, sync=True) as client:
        assert isinstance(client, openai.OpenAI)
        # off the event loop, which serves the simulator
        await asyncio.to_thread(client.chat.completions.create, messages=rollout.messages)
    (call,) = rollout.trace.calls
    assert isinstance(call, ModelCall) and call.response["content"].startswith("Here is my")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": True}, "without stream=True"),
        ({"n": 2}, "ask for one choice, not n=2"),
        ({"model": ""}, "model_resource.model_name is empty"),
    ],
)
async def test_the_traced_client_refuses_what_is_not_one_trajectory(
    options: dict[str, Any], message: str
) -> None:
    rollout = task("http://127.0.0.1:9/v1")  # nothing listens: a request would fail otherwise
    client = trace_client(rollout)
    with pytest.raises(RolloutError, match=message):
        await client.chat.completions.create(messages=rollout.messages, **options)
    await client.close()


def test_a_task_without_a_policy_url_has_no_client() -> None:
    with pytest.raises(RolloutError, match=r"model_resource\.base_url is empty"):
        trace_client(task(""))


def calls(processor: str, status: str, error: str) -> float:
    labels = {"processor": processor, "status": status, "error": error}
    return REGISTRY.get_sample_value("turnstream_processor_calls_total", labels) or 0.0


def timed(processor: str, status: str) -> float:
    labels = {"processor": processor, "status": status}
    return REGISTRY.get_sample_value("turnstream_processor_seconds_count", labels) or 0.0


class Observed(AbstractRewardProcessor):
    """Scores by what the message says: ok, flaky (FAILED) or boom (raises)."""

    @observe_processor
    async def process(self, input: RewardInput) -> RewardOutput:
        return self.score(input)

    @observe_processor
    def score(self, input: RewardInput) -> RewardOutput:
        said = input.agent_output.messages[-1]["content"]
        if said == "boom":
            raise KeyError("boom")
        if said == "flaky":
            return RewardOutput.failed("judge timed out")
        return RewardOutput.success(1.0)


def said(content: str, sample_id: str = "s1") -> RewardInput:
    return RewardInput.model_validate(
        {
            "agent_output": {"messages": [{"role": "user", "content": content}]},
            "request_metadata": {"sample_id": sample_id},
        }
    )


@pytest.mark.parametrize(
    ("content", "status", "error", "level", "detail"),
    [
        ("ok", "success", "", logging.INFO, ""),
        ("flaky", "failed", "failed", logging.WARNING, ": judge timed out"),
        ("boom", "exception", "KeyError", logging.ERROR, ": KeyError: 'boom'"),
    ],
)
async def test_observe_processor_counts_times_and_logs_each_call_once(
    caplog: pytest.LogCaptureFixture,
    content: str,
    status: str,
    error: str,
    level: int,
    detail: str,
) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.rewards.observe")
    names = ("Observed.process", "Observed.score")
    before = [(calls(n, status, error), timed(n, status)) for n in names]
    if status == "exception":
        with pytest.raises(KeyError):
            await Observed().process(said(content))
    else:
        out = await Observed().process(said(content))
        assert out.status is TaskStatus(status)
    after = [(calls(n, status, error), timed(n, status)) for n in names]
    assert [(c - c0, t - t0) for (c, t), (c0, t0) in zip(after, before, strict=True)] == [
        (1.0, 1.0),
        (1.0, 1.0),
    ]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name.endswith("observe")]
    assert [lv for lv, _ in lines] == [level, level]
    for (_, line), name in zip(lines, reversed(names), strict=True):  # score ends first
        head, _, rest = line.partition(" in ")
        assert head == f"{name}: {status}"
        assert rest.endswith(f" s [sample_id=s1]{detail}"), line


def test_observe_processor_on_a_function_names_it_and_flags_an_output_without_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pipeline.rewards.observe")

    @observe_processor
    def sloppy(input: RewardInput) -> Any:
        return {"score": 1.0}

    name = "test_observe_processor_on_a_function_names_it_and_flags_an_output_without_status"
    name += ".<locals>.sloppy"
    before = calls(name, "invalid", "dict")
    assert sloppy(said("ok")) == {"score": 1.0}
    assert calls(name, "invalid", "dict") - before == 1.0
    (record,) = [r for r in caplog.records if r.name.endswith("observe")]
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith("returned dict, which has no status")
