"""Shared by the rollout command tests: the SDK examples' directory, test processors, and an
aiohttp app served from a thread (for a command that runs its own event loop)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.testing.policy_sim import PolicySimulator
from tests.conftest import REPO

SDK = REPO / "examples" / "sdk"
TASK = SDK / "resources" / "rollout_input.json"
QUERY = REPO / "examples" / "rollouts" / "query.sh"

# Rollout processors that misbehave in each way a command must report, loaded by file path.
PROCESSORS = """
import asyncio

from pipeline.sdk import AbstractRolloutProcessor, AgentOutput, RolloutOutput, TaskStatus


class Refuses(AbstractRolloutProcessor):
    async def process(self, input):
        return RolloutOutput(status=TaskStatus.FAILED, error="the quote service is down")


class Sleeps(AbstractRolloutProcessor):
    async def process(self, input):
        await asyncio.sleep(30)
        return RolloutOutput(agent_output=AgentOutput(messages=[]), status=TaskStatus.SUCCESS)


class Raises(AbstractRolloutProcessor):
    async def process(self, input):
        raise KeyError("no tool named stock_price")


class SetupRaises(AbstractRolloutProcessor):
    def setup(self):
        raise ConnectionError("the sandbox is not reachable")

    def process(self, input):
        raise AssertionError("never run")


class AsyncSetup:
    async def setup(self):
        pass

    async def process(self, input):
        raise AssertionError("never run")


class NoInput:
    def process(self):
        raise AssertionError("never run")
"""


@pytest.fixture
def in_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run from examples/sdk, as the guide's class paths expect; its modules are dropped after."""
    monkeypatch.chdir(SDK)
    monkeypatch.syspath_prepend(str(SDK))
    yield SDK
    for name in [n for n in sys.modules if n == "functions" or n.startswith("functions.")]:
        del sys.modules[name]


@pytest.fixture
async def policy_simulator() -> AsyncIterator[tuple[PolicySimulator, str]]:
    """The policy simulator (a test double of an OpenAI-compatible server) and its /v1 URL."""
    sim = PolicySimulator()
    server = TestServer(sim.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield sim, str(server.make_url("/v1"))
    finally:
        await server.close()


@pytest.fixture
def processors(tmp_path: Path) -> str:
    """The file of misbehaving processors: ``f"{processors}:Raises"`` names one."""
    path = tmp_path / "processors.py"
    path.write_text(PROCESSORS)
    return str(path)


@contextmanager
def app_in_thread(app: web.Application) -> Iterator[str]:
    """``app`` served on a free port from a thread with its own event loop; yields its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, name="test-app", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()
