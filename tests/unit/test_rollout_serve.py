"""`turnstream rollout serve`'s app: a task in, its RolloutOutput out, whatever the processor does.

The app is served in-process on a real port (aiohttp's TestServer), the
policy simulator beside it; examples/rollouts/query.sh is run against it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from pipeline.rollouts.components import prepare
from pipeline.rollouts.serve import build_rollout_app
from pipeline.sdk import AgentOutput, RolloutInput, RolloutOutput, TaskStatus
from pipeline.testing.policy_sim import PolicySimulator
from tests.rollout_helpers import QUERY, TASK, in_sdk, policy_simulator

__all__ = ["in_sdk", "policy_simulator"]  # fixtures

DEMO = "functions.rollout.rollout_only.DemoRolloutProcessor"


class Gate:
    """A plain-def process that blocks its thread until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def process(self, input: RolloutInput) -> RolloutOutput:
        self.entered.set()
        self.opened.wait(timeout=10)
        return RolloutOutput(
            agent_output=AgentOutput(messages=input.messages), status=TaskStatus.SUCCESS
        )


class Raises:
    async def process(self, input: RolloutInput) -> RolloutOutput:
        raise KeyError("no tool named stock_price")


class SyncRaises:
    def process(self, input: RolloutInput) -> RolloutOutput:
        raise ValueError("bad tool arguments")


class OwnTimeout:
    async def process(self, input: RolloutInput) -> RolloutOutput:
        raise TimeoutError("the sandbox did not answer")


class Closes:
    closed = False

    async def process(self, input: RolloutInput) -> RolloutOutput:
        return RolloutOutput(status=TaskStatus.FAILED, error="no tools today")

    async def close(self) -> None:
        self.closed = True


async def serving(processor: Any, **model: str) -> TestServer:
    app = build_rollout_app(processor, concurrency=4, model=dict(model), max_body_bytes=64 * 1024)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def task(**changes: Any) -> dict[str, Any]:
    return {**json.loads(TASK.read_text()), **changes}


async def post(server: TestServer, body: Any) -> tuple[int, Any]:
    async with (
        ClientSession() as http,
        http.post(server.make_url("/rollout"), json=body) as response,
    ):
        return response.status, await response.json()


async def get(server: TestServer, path: str) -> tuple[int, Any]:
    async with ClientSession() as http, http.get(server.make_url(path)) as response:
        return response.status, await response.json()


async def test_the_guides_rollout_is_served_on_the_guides_task(
    in_sdk: Path, policy_simulator: tuple[PolicySimulator, str]
) -> None:
    sim, url = policy_simulator
    server = await serving(prepare(DEMO, "rollout"), base_url=url)
    try:
        status, out = await post(server, task())
        assert status == 200 and out["status"] == "success", out
        assert out["agent_output"]["messages"][-1] == {
            "role": "assistant",
            "content": "Here is my answer to: Hello, please introduce yourself",
        }
        assert sim.chat_calls == 1
        status, health = await get(server, "/health")
        assert status == 200
        assert health == {
            "status": "ok",
            "processor": "DemoRolloutProcessor",
            "running": 0,
            "concurrency": 4,
            "outcomes": {"success": 1, "failed": 0},
        }
    finally:
        await server.close()


async def test_a_blocking_sync_process_leaves_the_server_answering_and_times_out() -> None:
    gate = Gate()
    server = await serving(gate)
    try:
        waiting = asyncio.create_task(post(server, task(sampling_params={"timeout": 5})))
        assert await asyncio.to_thread(gate.entered.wait, 5)
        status, health = await get(server, "/health")  # answered while process() blocks
        assert status == 200 and health["running"] == 1
        gate.opened.set()
        status, out = await waiting
        assert status == 200 and out["status"] == "success"

        gate.opened.clear()
        status, out = await post(server, task(sampling_params={"timeout": 0.2}))
        assert status == 200
        assert out == {
            "agent_output": {
                "messages": [],
                "rollout_extra": None,
                "rollout_metrics": None,
                "reward_score": None,
            },
            "status": "failed",
            "error": "timed out after 0.2 s (sampling_params.timeout)",
            "rollout_metrics": None,
        }
        assert (await get(server, "/health"))[1]["outcomes"] == {"success": 1, "failed": 1}
    finally:
        gate.opened.set()
        await server.close()


async def test_an_exception_in_process_is_a_failed_output_with_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="pipeline.rollouts.run")
    for processor, error in [
        (Raises(), "Raises.process raised KeyError: 'no tool named stock_price'"),
        (SyncRaises(), "SyncRaises.process raised ValueError: bad tool arguments"),  # in its thread
        # a TimeoutError of the processor's own is no timeout of the task's
        (OwnTimeout(), "OwnTimeout.process raised TimeoutError: the sandbox did not answer"),
    ]:
        server = await serving(processor)
        try:
            status, out = await post(server, task())
        finally:
            await server.close()
        assert (status, out["status"], out["error"]) == (200, "failed", error)
    logged = [r for r in caplog.records if r.name == "pipeline.rollouts.run"]
    assert len(logged) == 3 and all(r.exc_info for r in logged)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"messages": [', "request body: not valid JSON"),
        (b"[1, 2]", "request body: expected a JSON object, got list"),
        (
            json.dumps(task(sampling_params={"max_turns": 0})).encode(),
            "request body: not a RolloutInput:\n  sampling_params.max_turns: Input should be "
            "greater than or equal to 1",
        ),
    ],
)
async def test_a_body_that_is_no_task_is_a_400_that_says_why(body: bytes, message: str) -> None:
    server = await serving(Closes())
    try:
        async with ClientSession() as http, http.post(server.make_url("/rollout"), data=body) as r:
            assert r.status == 400
            assert (await r.json())["error"].startswith(message)
        async with ClientSession() as http, http.get(server.make_url("/nope")) as r:
            assert (r.status, await r.json()) == (404, {"error": "Not Found"})
        async with ClientSession() as http, http.get(server.make_url("/rollout")) as r:
            assert (r.status, r.headers["Allow"]) == (405, "POST")
            assert await r.json() == {"error": "Method Not Allowed"}
        huge = json.dumps(task(ground_truth="x" * 100_000)).encode()
        async with ClientSession() as http, http.post(server.make_url("/rollout"), data=huge) as r:
            assert r.status == 413
            assert (await r.json())["error"].startswith("Maximum request body size 65536")
    finally:
        await server.close()


async def test_the_processor_is_closed_with_the_server() -> None:
    processor = Closes()
    server = await serving(processor)
    status, out = await post(server, task())
    assert (status, out["status"], out["error"]) == (200, "failed", "no tools today")
    assert not processor.closed
    await server.close()
    assert processor.closed


async def test_query_sh_posts_the_guides_task_to_the_served_port(
    in_sdk: Path, policy_simulator: tuple[PolicySimulator, str], tmp_path: Path
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("examples/rollouts/query.sh needs curl, which is not installed here")
    sim, url = policy_simulator
    server = await serving(prepare(DEMO, "rollout"), base_url=url)
    try:
        script = await asyncio.create_subprocess_exec(
            "bash", str(QUERY), str(server.port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(script.communicate(), 60)
        assert script.returncode == 0, stderr.decode()
        out = json.loads(stdout)
        assert out["status"] == "success"
        assert out["agent_output"]["messages"][0]["content"] == "Hello, please introduce yourself"
        assert sim.requests[0]["messages"] == [
            {"role": "user", "content": "Hello, please introduce yourself"}
        ]
        # a task the server refuses: the script fails, and prints the server's reason
        refused = tmp_path / "refused.json"
        refused.write_text('{"messages": "hello"}')
        script = await asyncio.create_subprocess_exec(
            "bash", str(QUERY), str(server.port), str(refused),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, _ = await asyncio.wait_for(script.communicate(), 60)
        assert script.returncode == 22  # curl's "HTTP error" under --fail-with-body
        assert "messages: Input should be a valid list" in json.loads(stdout)["error"]
    finally:
        await server.close()


class Unsendable:
    async def process(self, input: RolloutInput) -> RolloutOutput:
        messages = [{"role": "assistant", "content": object()}]
        return RolloutOutput(agent_output=AgentOutput(messages=messages), status=TaskStatus.SUCCESS)


async def test_an_error_past_the_processor_is_a_500_that_says_what(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="pipeline.rollouts.serve")
    server = await serving(Unsendable())
    try:
        status, body = await post(server, task())
    finally:
        await server.close()
    assert status == 500
    assert body["error"].startswith("PydanticSerializationError: Unable to serialize unknown type")
    logged = [r for r in caplog.records if r.name == "pipeline.rollouts.serve"]
    assert [r.getMessage() for r in logged] == ["POST /rollout failed"] and logged[0].exc_info
