"""The capture proxy in front of the policy simulator, driven by the official openai SDK.

Every test reads what the proxy produced back from the real broker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from kafka import KafkaProducer

from pipeline.backoff import RetryPolicy
from pipeline.broker.local import free_port_pair
from pipeline.events import DeadLetter, SessionEnd, Turn, decode_as, decode_input
from pipeline.proxy.sink import EventSink
from pipeline.settings import Settings
from pipeline.testing.policy_sim import SILENT
from pipeline.topics import admin
from tests.kafka.helpers import read_all, spawn, wait_http

MAIN = {"X-Turn-Type": "main"}


def start_sim(tmp_path: Path, *args: str) -> tuple[str, subprocess.Popen]:
    port = free_port_pair()
    proc = spawn(
        ["pipeline.testing.policy_sim", "--port", str(port), *args], tmp_path / f"sim{port}.log"
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc)
    return url, proc


def start_proxy(
    env: dict[str, str], upstream: str, data_dir: Path, log: Path, **extra: str
) -> tuple[str, subprocess.Popen]:
    port = free_port_pair()
    proxy_env = {**env, **{f"TURNSTREAM_PROXY_{k.upper()}": v for k, v in extra.items()}}
    args = ["pipeline.cli", "proxy", "--upstream", upstream, "--port", str(port)]
    proc = spawn([*args, "--data-dir", str(data_dir)], log, proxy_env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc)
    return url, proc


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    return proc.wait(timeout=60)


@pytest.fixture
def stack(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> Iterator[Callable[..., tuple[str, str]]]:
    """Start a policy simulator and a proxy in front of it; stopped at the end."""
    admin.apply(settings)
    procs: list[subprocess.Popen] = []

    def make(*sim_args: str, **proxy_env: str) -> tuple[str, str]:
        sim, sim_proc = start_sim(tmp_path, *sim_args)
        procs.append(sim_proc)
        proxy, proxy_proc = start_proxy(
            cli_env, sim, tmp_path / "proxy", tmp_path / "proxy.log", **proxy_env
        )
        procs.append(proxy_proc)
        return sim, proxy

    yield make
    for proc in reversed(procs):
        stop(proc)


def turns_of(settings: Settings, want: int, timeout_s: float = 30.0) -> list:
    """Input events on chat.turns, once at least ``want`` are there."""
    deadline = time.monotonic() + timeout_s
    while True:
        events = [
            decode_input(r.value) for r in read_all(settings, settings.topics.chat_turns.name)
        ]
        if len(events) >= want or time.monotonic() > deadline:
            return events
        time.sleep(0.3)


def sim_requests(sim: str) -> list[dict]:
    return json.loads(urllib.request.urlopen(sim + "/sim/requests").read())["requests"]


def test_openai_sdk_turns_stream_through_the_proxy_into_kafka(
    settings: Settings, stack: Callable[..., tuple[str, str]]
) -> None:
    out = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    version = {"version": 7, "path": "/w/v000007", "step": 70, "ts": 1.0}
    out.send(
        settings.topics.policy_versions.name, key=b"policy", value=json.dumps(version).encode()
    )
    out.flush()
    out.close()
    sim, proxy = stack("--token-delay-ms", "150", token_ids="true")
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="unused", max_retries=0)
    session = {"X-Session-Id": "sdk-1"}
    messages = [{"role": "user", "content": "plan a trip to Lisbon"}]

    # 1. non-streaming main turn
    first = client.chat.completions.create(
        model="policy-sim", messages=messages, extra_headers={**session, **MAIN}
    )
    # 2. streaming main turn: chunks must arrive as the upstream sends them
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "no, make it Porto"},
    ]
    arrivals, pieces = [], []
    stream = client.chat.completions.create(
        model="policy-sim",
        messages=messages,
        stream=True,
        extra_headers={**session, **MAIN},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
            pieces.append(chunk.choices[0].delta.content)
    streamed = "".join(pieces)
    assert len(pieces) >= 5
    # Buffered relaying would deliver every chunk at once; the simulator spaces them 150 ms.
    assert arrivals[-1] - arrivals[0] >= 0.5 * 0.150 * (len(pieces) - 1)
    # 3. a side turn (heartbeat), session fields in the body instead of headers
    client.chat.completions.create(
        model="policy-sim",
        messages=[{"role": "user", "content": "heartbeat"}],
        extra_body={"session_id": "sdk-1", "turn_type": "side"},
    )
    # 4. a streamed tool call that ends the session
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    stream = client.chat.completions.create(
        model="policy-sim",
        messages=[{"role": "user", "content": "search trains to Porto"}],
        tools=tools,
        stream=True,
        extra_headers={**session, **MAIN, "X-Session-Done": "true"},
    )
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in stream
        if c.choices and c.choices[0].delta.tool_calls
    )

    events = turns_of(settings, 5)
    assert [type(e).__name__ for e in events] == ["Turn"] * 4 + ["SessionEnd"]
    turns: list[Turn] = events[:4]
    assert all(t.session_id == "sdk-1" for t in events)
    assert [t.turn_index for t in turns] == [0, 1, 2, 3]
    assert [t.turn_type for t in turns] == ["main", "main", "side", "main"]
    assert turns[0].response.content == first.choices[0].message.content
    assert turns[1].response.content == streamed
    assert turns[1].messages[-1].content == "no, make it Porto"
    for turn in (turns[0], turns[1]):
        assert turn.policy_version == 7
        assert turn.response_ids and turn.prompt_ids
        assert turn.response_logprobs and len(turn.response_logprobs) == len(turn.response_ids)
        assert all(lp < 0 for lp in turn.response_logprobs)
    call = turns[3].response.tool_calls[0]
    assert call["function"] == {"name": "search", "arguments": arguments}
    assert json.loads(arguments) == {"query": "search trains to Porto"}
    assert turns[3].tools == tools
    end = events[4]
    assert isinstance(end, SessionEnd) and end.reason == "client"
    # What reached the policy server: session fields gone, log-probs and ids asked for.
    sent = sim_requests(sim)
    assert len(sent) == 4
    for body in sent:
        assert not {"session_id", "turn_type", "session_done"} & set(body)
        assert body["logprobs"] is True and body["return_token_ids"] is True
    health = json.loads(urllib.request.urlopen(proxy + "/healthz").read())
    assert health["turns_recorded"] == 4 and health["policy_version"] == 7
    assert health["kafka"]["delivered"] == 5 and health["kafka"]["spooled"] == 0
    metrics = urllib.request.urlopen(proxy + "/metrics").read().decode()
    assert 'turnstream_proxy_turns_total{session="given",turn_type="main"} 3.0' in metrics


def test_an_answer_that_ends_at_once_is_recorded_as_the_policys_turn(
    settings: Settings, stack: Callable[..., tuple[str, str]]
) -> None:
    # A policy that learns brevity may end its turn with no text: that is its action, and
    # the user's reply to it is the evidence that trains it. Dropping it would hide it from
    # the judge and the trainer (and leave the user's next state without its turn).
    _sim, proxy = stack(token_ids="true")
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="unused", max_retries=0)
    headers = {"X-Session-Id": "quiet-1", **MAIN}
    asked = [{"role": "user", "content": f"hi {SILENT}"}]
    plain = client.chat.completions.create(model="m", messages=asked, extra_headers=headers)
    assert plain.choices[0].message.content == "" and plain.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="m", messages=asked, stream=True, extra_headers=headers
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == ""
    turns = turns_of(settings, 2)
    assert [(t.turn_index, t.response.finish_reason) for t in turns] == [(0, "stop"), (1, "stop")]
    assert not any(t.response.content or t.response.tool_calls for t in turns)
    health = json.loads(urllib.request.urlopen(proxy + "/healthz").read())
    assert health["turns_recorded"] == 2 and health["not_recorded"] == {}


def test_errors_are_passed_through_and_record_nothing(
    settings: Settings, stack: Callable[..., tuple[str, str]], tmp_path: Path
) -> None:
    _sim, proxy = stack("--chat-fail-first", "1", api_key="s3cret", max_body_bytes="4096")
    anonymous = openai.OpenAI(base_url=proxy + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        anonymous.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert denied.value.status_code == 401
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="s3cret", max_retries=0)
    hello = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.InternalServerError) as upstream:
        client.chat.completions.create(model="m", messages=hello, extra_headers=MAIN)
    assert upstream.value.status_code == 500
    assert "simulated policy server failure" in str(upstream.value)
    with pytest.raises(openai.BadRequestError, match="X-Turn-Type must be"):
        client.chat.completions.create(
            model="m", messages=hello, extra_headers={"X-Turn-Type": "primary"}
        )
    with pytest.raises(openai.APIStatusError) as too_big:
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * 8000}], extra_headers=MAIN
        )
    assert too_big.value.status_code == 413
    ok = client.chat.completions.create(
        model="m", messages=hello, extra_headers={**MAIN, "X-Session-Id": "e-1"}
    )
    assert ok.choices[0].message.content
    models = client.models.list()
    assert [m.id for m in models.data] == ["policy-sim"]
    health = json.loads(urllib.request.urlopen(proxy + "/healthz").read())  # no auth needed
    assert health["turns_recorded"] == 1
    events = turns_of(settings, 1)
    assert [(e.session_id, e.turn_index) for e in events] == [("e-1", 0)]


def test_an_unreachable_upstream_is_a_502(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    dead = f"http://127.0.0.1:{free_port_pair()}"
    proxy, proc = start_proxy(cli_env, dead, tmp_path / "proxy", tmp_path / "proxy.log")
    try:
        client = openai.OpenAI(base_url=proxy + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as bad_gateway:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert bad_gateway.value.status_code == 502
        assert "upstream" in str(bad_gateway.value)
    finally:
        assert stop(proc) == 0


def test_a_restarted_proxy_continues_each_session(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    admin.apply(settings)
    sim, sim_proc = start_sim(tmp_path)
    try:
        for run in range(2):
            proxy, proc = start_proxy(
                cli_env, sim, tmp_path / "proxy", tmp_path / f"proxy{run}.log"
            )
            client = openai.OpenAI(base_url=proxy + "/v1", api_key="x", max_retries=0)
            for _ in range(2):
                client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "again"}],
                    extra_headers={**MAIN, "X-Session-Id": "r-1"},
                )
            assert stop(proc) == 0
            log = (tmp_path / f"proxy{run}.log").read_text()
            assert "2 turn(s) recorded, 2 event(s) delivered, 0 spooled" in log
    finally:
        stop(sim_proc)
    assert [e.turn_index for e in turns_of(settings, 4)] == [0, 1, 2, 3]


def test_sink_spools_what_it_cannot_buffer_or_deliver(settings: Settings, tmp_path: Path) -> None:
    """Full buffer and failed deliveries go to the spool file, never blocking or vanishing."""
    from pipeline.broker.clients import producer

    admin.apply(settings)
    topic = settings.topics.chat_turns.name
    resend = RetryPolicy(2, initial_delay_s=0.1, max_delay_s=0.1)
    sink = EventSink(producer(settings, 1 << 20), 2, resend, tmp_path / "spool")
    values = [b'{"n": %d}' % i for i in range(3)]
    assert [sink.offer(topic, b"k", v) for v in values] == [True, True, False]  # not started
    assert (tmp_path / "spool" / f"{topic}.jsonl").read_bytes() == values[2] + b"\n"
    sink.start()
    stats = sink.close(timeout_s=30)
    assert stats["delivered"] == 2 and stats["buffer_full"] == 1 and stats["spooled"] == 1
    assert [r.value for r in read_all(settings, topic)] == values[:2]

    missing = settings.topic_prefix + "no.such.topic"
    failing = EventSink(producer(settings, 1 << 20, max_block_ms=300), 10, resend, tmp_path / "s2")
    failing.start()
    assert failing.offer(missing, None, b'{"lost": false}')
    deadline = time.monotonic() + 30
    while failing.spooled == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    stats = failing.close(timeout_s=5)
    assert stats["retried"] == 1 and stats["spooled"] == 1 and stats["delivered"] == 0
    assert (tmp_path / "s2" / f"{missing}.jsonl").read_bytes() == b'{"lost": false}\n'
    assert "KafkaTimeoutError" in (stats["last_error"] or "")


def test_a_turn_the_schema_refuses_becomes_a_dead_letter(
    settings: Settings, stack: Callable[..., tuple[str, str]]
) -> None:
    _sim, proxy = stack()
    client = openai.OpenAI(base_url=proxy + "/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model="m",
        messages=[{"role": "function", "name": "f", "content": "legacy role"}],  # type: ignore[list-item]
        extra_headers={**MAIN, "X-Session-Id": "d-1"},
    )
    assert answer.choices[0].message.content  # the user is served regardless
    deadline = time.monotonic() + 30
    while not (letters := read_all(settings, settings.topics.deadletter.name)):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    letter = decode_as(DeadLetter, letters[0].value)
    assert letter.stage == "proxy" and "messages" in letter.error
    assert letter.source == "proxy/d-1/0"
    assert read_all(settings, settings.topics.chat_turns.name) == []
    try:
        urllib.request.urlopen(proxy + "/healthz").read()
    except urllib.error.URLError as exc:  # pragma: no cover - a diagnostic, not the check
        pytest.fail(f"proxy stopped answering: {exc}")
