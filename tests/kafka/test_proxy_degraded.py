"""The capture proxy with Kafka down at start: it serves at once, spools, and when a broker
comes up (this test's own, started late) every spooled turn reaches chat.turns once."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from pipeline.broker.local import LocalKafka, free_port_pair
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings
from pipeline.topics import admin
from tests.kafka.helpers import partition_of, session_on, turnstream
from tests.kafka.test_proxy import MAIN, start_proxy, start_sim, stop, turns_of


def health(proxy: str) -> dict:
    return json.loads(urllib.request.urlopen(proxy + "/healthz", timeout=10).read())


def until_drained(proxy: str, tmp_path: Path) -> None:
    deadline = time.monotonic() + 60
    while (kafka := health(proxy)["kafka"])["spool_pending"] or kafka["drained"] < 4:
        assert time.monotonic() < deadline, (tmp_path / "proxy.log").read_text()[-3000:]
        time.sleep(0.2)


def until_seen(settings: Settings, session: str) -> list:
    """Every event on chat.turns once one of ``session``'s is there."""
    deadline = time.monotonic() + 60
    while True:
        events = turns_of(settings, 0)
        if any(e.session_id == session for e in events):
            return events
        assert time.monotonic() < deadline, f"{session} never reached chat.turns"
        time.sleep(0.2)


def test_a_proxy_started_without_kafka_serves_spools_and_delivers_once_kafka_is_up(
    tmp_path: Path, topic_prefix: str
) -> None:
    port = free_port_pair()
    settings = Settings(
        kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"), topic_prefix=topic_prefix
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=settings.bootstrap_servers, TURNSTREAM_TOPIC_PREFIX=topic_prefix
    )
    sim, sim_proc = start_sim(tmp_path)
    started = time.monotonic()
    proxy, proc = start_proxy(env, sim, tmp_path / "proxy", tmp_path / "proxy.log")
    local: LocalKafka | None = None
    try:
        assert time.monotonic() - started < 20  # the interpreter's start; no Kafka wait
        client = openai.OpenAI(base_url=proxy + "/v1", api_key="x", max_retries=0)
        for i in range(3):
            answer = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"question {i}"}],
                extra_headers={**MAIN, "X-Session-Id": "down-1", "X-Session-Done": str(i == 2)},
            )
            assert answer.choices[0].message.content
        state = health(proxy)
        assert state["status"] == "degraded" and "spooled" in state["degraded"]
        assert state["kafka"]["state"] == "unreachable" and state["kafka"]["spool_pending"] == 4
        assert "KAFKA UNREACHABLE" in (tmp_path / "proxy.log").read_text()

        local = LocalKafka(
            LocalKafkaSettings(port=port, data_dir=tmp_path / "kafka", heap="512M"),
            log=lambda _msg: None,
        )
        local.start()
        admin.apply(settings)
        deadline = time.monotonic() + 90
        while health(proxy)["status"] != "ok":
            assert time.monotonic() < deadline, (tmp_path / "proxy.log").read_text()[-3000:]
            time.sleep(0.5)
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "after"}],
            extra_headers={**MAIN, "X-Session-Id": "down-2"},
        )
        # The spool is sent: then a marker turn, on down-1's partition. The proxy sends in
        # order, so once the marker is on chat.turns, a spooled turn sent twice would be too.
        until_drained(proxy, tmp_path)
        marker = session_on(settings, partition_of(settings, "down-1"), "marker")
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "the end"}],
            extra_headers={**MAIN, "X-Session-Id": marker},
        )
        events = until_seen(settings, marker)
        keys = [(e.session_id, e.type, getattr(e, "turn_index", None)) for e in events]
        assert [k for k in keys if k[0] == marker] == [(marker, "turn", 0)]
        keys = [k for k in keys if k[0] != marker]
        spooled = [k for k in keys if k[0] == "down-1"]  # one partition: in the order served
        assert spooled == [
            ("down-1", "turn", 0),
            ("down-1", "turn", 1),
            ("down-1", "turn", 2),
            ("down-1", "session_end", None),
        ]
        assert len(keys) == 5 and ("down-2", "turn", 0) in keys
        state = health(proxy)
        assert state["kafka"]["drained"] == 4 and state["kafka"]["spool_pending"] == 0
        assert not list((tmp_path / "proxy" / "spool").glob("*.jsonl"))
        assert "is back after" in (tmp_path / "proxy.log").read_text()
    finally:
        try:
            assert stop(proc) == 0
        finally:
            stop(sim_proc)
            if local is not None:
                local.stop()


@pytest.mark.parametrize(
    ("servers", "says"),
    [("localhost:90x2", "not host:port"), ("kafka.invalid:9092", "do not resolve")],
)
def test_a_misconfigured_bootstrap_is_reported_clearly(
    servers: str, says: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
    env["KAFKA_BOOTSTRAP_SERVERS"] = servers
    if "x" in servers:  # cannot ever work: the proxy refuses to start
        done = turnstream(
            "proxy", "--upstream", "http://127.0.0.1:9", "--port", str(free_port_pair()), env=env
        )
        assert done.returncode == 1 and says in done.stderr
        return
    sim, sim_proc = start_sim(tmp_path)
    proxy, proc = start_proxy(env, sim, tmp_path / "proxy", tmp_path / "proxy.log")
    try:
        state = health(proxy)
        assert state["status"] == "degraded" and says in state["kafka"]["problem"]
        assert says in (tmp_path / "proxy.log").read_text()
    finally:
        try:
            assert stop(proc) == 0
        finally:
            stop(sim_proc)
