"""The proxy's spool: sent in order, each line once, resumable, with appends during a drain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.errors import BrokerError, ConfigError
from pipeline.proxy.link import bootstrap_addresses
from pipeline.proxy.spool import Record, Spool

TOPICS = ["t.chat.turns", "t.deadletter"]


def event(session: str, n: int) -> bytes:
    return json.dumps({"type": "turn", "session_id": session, "turn_index": n}).encode()


def test_a_drain_sends_every_line_once_in_order_with_keys(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in range(1203):
        spool.append(TOPICS[0], event("s", n))
    spool.append(TOPICS[1], b'{"stage": "proxy"}')
    sent: list[Record] = []
    late = [event("late", 0)]

    def send(records: list[Record]) -> None:
        sent.extend(records)
        while late:  # an event captured while the drain runs is sent in the same drain
            spool.append(TOPICS[0], late.pop())

    went_live: list[int] = []
    assert spool.drain(TOPICS, send, lambda: went_live.append(spool.pending(TOPICS))) == 1205
    assert went_live == [0] and not list(tmp_path.iterdir())
    turns = [json.loads(v) for t, _k, v in sent if t == TOPICS[0]]
    assert [t["turn_index"] for t in turns[:1203]] == list(range(1203))
    assert turns[-1]["session_id"] == "late"
    assert {k for t, k, _v in sent if t == TOPICS[0]} == {b"s", b"late"}
    assert [k for t, k, _v in sent if t == TOPICS[1]] == [None]


def test_a_failed_drain_resumes_after_the_last_acknowledged_chunk(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in range(700):
        spool.append(TOPICS[0], event("s", n))
    sent: list[Record] = []

    def fail_second_chunk(records: list[Record]) -> None:
        if sent:
            raise BrokerError("Kafka went away")
        sent.extend(records)

    with pytest.raises(BrokerError):
        spool.drain(TOPICS, fail_second_chunk, lambda: None)
    assert len(sent) == 500 and spool.pending(TOPICS) == 200
    again: list[Record] = []
    assert Spool(tmp_path).drain(TOPICS, again.extend, lambda: None) == 200
    assert [json.loads(v)["turn_index"] for _t, _k, v in again] == list(range(500, 700))


@pytest.mark.parametrize("servers", ["localhost", "localhost:x", ":9092", "h:0", "a:1,b"])
def test_a_bootstrap_that_cannot_be_right_is_a_config_error(servers: str) -> None:
    with pytest.raises(ConfigError, match="not host:port"):
        bootstrap_addresses(servers)


def test_bootstrap_addresses_read_hosts_and_ports() -> None:
    assert bootstrap_addresses("k1:9092, [::1]:9093") == [("k1", 9092), ("::1", 9093)]
