"""The capture proxy's rollout route: its URL, parsing it, and the headers it stands for."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from pipeline.proxy.capture import BadRequest, request_meta
from pipeline.proxy.rollout_route import (
    RolloutRoute,
    base_url,
    end_url,
    parse_end,
    parse_route,
    proxy_root,
    route_headers,
)

ROUTE = RolloutRoute("rollout:a/b:0:1", "rollout:a/b", 2, 25)


def test_the_base_url_encodes_each_segment_and_keeps_the_proxy_root() -> None:
    for given in ("http://p:30000/v1", "http://p:30000/v1/", "http://p:30000"):
        assert proxy_root(given) == "http://p:30000"
        assert base_url(given, ROUTE) == (
            "http://p:30000/rollouts/rollout%3Aa%2Fb%3A0%3A1/rollout%3Aa%2Fb/2/25/v1"
        )
    assert end_url("http://p:30000/v1", "s 1/x") == "http://p:30000/rollouts/s%201%2Fx/end"


def test_parsing_the_decoded_segments_gives_the_route_back_or_a_400() -> None:
    match = {"session_id": ROUTE.session_id, "group_id": ROUTE.group_id,
             "group_size": "2", "max_turns": "25"}  # fmt: skip
    assert parse_route(match) == ROUTE
    bad_segments = [("group_size", "0"), ("group_size", "1025"), ("max_turns", "x"),
                    ("max_turns", "0"), ("session_id", " "), ("group_id", "g" * 300)]  # fmt: skip
    for field, bad in bad_segments:
        with pytest.raises(BadRequest, match=field):
            parse_route({**match, field: bad})


def test_the_route_stands_for_the_session_headers_a_main_turn_and_no_session_done() -> None:
    sent = CIMultiDict({"x-session-id": "other", "X-Session-Done": "true", "Authorization": "k"})
    headers = route_headers(ROUTE, sent)
    meta = request_meta(headers, {"session_id": "body"}, "side")
    assert (meta.session_id, meta.group_id, meta.group_size) == (
        ROUTE.session_id,
        ROUTE.group_id,
        2,
    )
    assert meta.turn_type == "main" and not meta.done and headers["authorization"] == "k"
    side = request_meta(route_headers(ROUTE, {"X-Turn-Type": "side"}), {}, "main")
    assert side.turn_type == "side"


def test_an_end_says_success_or_failed_with_numeric_metrics() -> None:
    end = parse_end({"status": "success", "rollout_metrics": {"calls": 2, "s": 0.5}})
    assert end.succeeded and end.rollout_metrics == {"calls": 2.0, "s": 0.5}
    failed = parse_end({"status": "failed", "error": "boom"})
    assert not failed.succeeded and failed.error == "boom" and failed.rollout_metrics == {}
    for bad in [[], {"status": "done"}, {"status": "success", "rollout_metrics": {"x": "1"}},
                {"status": "success", "rollout_metrics": {"x": True}}]:  # fmt: skip
        with pytest.raises(BadRequest):
            parse_end(bad)


def test_an_end_carries_the_tasks_ground_truth_and_the_rollouts_messages() -> None:
    said = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    end = parse_end({"status": "success", "ground_truth": {"answer": "4"}, "messages": said})
    assert end.ground_truth == {"answer": "4"} and end.messages == said
    assert parse_end({"status": "success"}).messages is None
    for messages, where in [({"role": "user"}, "a list"), ([said[0], "4"], "messages\\[1\\]"),
                            ([{"content": "no role"}], "messages\\[0\\]")]:  # fmt: skip
        with pytest.raises(BadRequest, match=where):
            parse_end({"status": "success", "messages": messages})
