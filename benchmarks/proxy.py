"""Capture-proxy overhead: latency of the policy simulator called directly vs through the proxy.

Starts a broker (unless KAFKA_BOOTSTRAP_SERVERS is set), the policy simulator
(a test double, no model, answers at once) and `turnstream proxy` in front of
it. Sends the same chat requests, one at a time, alternating direct and
proxied, streaming and not; reports p50/p99 of the whole response (and of the
first streamed chunk) and the difference the proxy adds, then checks that
every proxied request became a turn on chat.turns. Prints a table and writes
benchmarks/results/proxy.json.

    python benchmarks/proxy.py [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from common import broker, pct, spawn, stop, wait_http, write_result

from pipeline.broker.local import free_port_pair
from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.topics.offsets import end_offsets


async def one(
    http: aiohttp.ClientSession, url: str, body: dict, headers: dict
) -> tuple[float, float]:
    """(seconds to the first body chunk, seconds to the end) of one request."""
    start = time.perf_counter()
    first = None
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for _chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - start
    return first or 0.0, time.perf_counter() - start


async def measure(direct: str, proxy: str, n: int) -> dict:
    out: dict = {}
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            samples: dict[str, list[tuple[float, float]]] = {"direct": [], "proxy": []}
            for i in range(n + 20):  # the first 20 warm connections up and are dropped
                body = {
                    "model": "policy-sim",
                    "stream": stream,
                    "logprobs": True,
                    "messages": [
                        {"role": "system", "content": "You are a careful coding agent."},
                        {"role": "user", "content": f"request {i}: list the failing tests"},
                    ],
                }
                session = {"X-Session-Id": f"bench-{int(stream)}-{i % 50}", "X-Turn-Type": "main"}
                for target, url in (("direct", direct), ("proxy", proxy)):
                    result = await one(http, url, body, session)
                    if i >= 20:
                        samples[target].append(result)
            mode = "stream" if stream else "non_stream"
            for target, rows in samples.items():
                out[f"{mode}_{target}_p50_ms"] = round(1000 * pct([r[1] for r in rows], 0.5), 3)
                out[f"{mode}_{target}_p99_ms"] = round(1000 * pct([r[1] for r in rows], 0.99), 3)
                if stream:
                    first = [r[0] for r in rows]
                    out[f"{mode}_{target}_first_chunk_p50_ms"] = round(1000 * pct(first, 0.5), 3)
            for q in ("p50", "p99"):
                out[f"{mode}_added_{q}_ms"] = round(
                    out[f"{mode}_proxy_{q}_ms"] - out[f"{mode}_direct_{q}_ms"], 3
                )
    return out


def run(settings: Settings, n: int, workdir: Path) -> dict:
    admin.apply(settings)
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix,
    }
    sim_port, proxy_port = free_port_pair(), free_port_pair()
    sim_log, proxy_log = workdir / "sim.log", workdir / "proxy.log"
    sim = spawn(["pipeline.testing.policy_sim", "--port", str(sim_port)], env, sim_log)
    direct = f"http://127.0.0.1:{sim_port}"
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    proxy = spawn(
        [
            "pipeline.cli",
            "proxy",
            "--upstream",
            direct,
            "--port",
            str(proxy_port),
            "--data-dir",
            str(workdir / "proxy"),
            "--loglevel",
            "warning",
        ],
        env,
        proxy_log,
    )
    try:
        wait_http(direct + "/health", sim, sim_log)
        wait_http(proxy_url + "/healthz", proxy, proxy_log)
        result = asyncio.run(measure(direct, proxy_url, n))
        proxied = 2 * (n + 20)
        topic = settings.topics.chat_turns.name
        deadline = time.monotonic() + 60
        while (turns := end_offsets(settings, [topic])[topic]) < proxied:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        result.update(requests_per_mode=n, proxied_requests=proxied, turns_on_chat_turns=turns)
        return result
    finally:
        for proc in (proxy, sim):
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="per mode and target")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, broker(Path(tmp)) as settings:
        settings = settings.model_copy(update={"topic_prefix": f"bench{uuid.uuid4().hex[:6]}."})
        result = run(settings, args.requests, Path(tmp))
    write_result("proxy", result)
    print(f"\n{'mode':<12}{'path':<8}{'p50 ms':>10}{'p99 ms':>10}{'first chunk p50':>17}")
    for mode in ("non_stream", "stream"):
        for target in ("direct", "proxy"):
            first = result.get(f"{mode}_{target}_first_chunk_p50_ms", "")
            print(
                f"{mode:<12}{target:<8}{result[f'{mode}_{target}_p50_ms']:>10}"
                f"{result[f'{mode}_{target}_p99_ms']:>10}{first!s:>17}"
            )
        print(
            f"{mode:<12}{'added':<8}{result[f'{mode}_added_p50_ms']:>10}"
            f"{result[f'{mode}_added_p99_ms']:>10}"
        )
    print(
        f"turns on chat.turns: {result['turns_on_chat_turns']} "
        f"of {result['proxied_requests']} proxied requests"
    )


if __name__ == "__main__":
    main()
