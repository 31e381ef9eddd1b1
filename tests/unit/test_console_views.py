"""The console's pages as pure functions: SVG charts, the view state in the URL, a sample's
panel (escaped, votes, hint, OPD colours), reviews as gold lines, and the GET routes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from urllib.parse import parse_qs, unquote_plus, urlsplit

import orjson
from aiohttp.test_utils import TestClient, TestServer

from pipeline.console.index import ConsoleIndex
from pipeline.console.reader import ReaderStatus
from pipeline.console.reviews import build_review, gold_line, token_ok
from pipeline.console.sample_view import ReviewForm, advantage_colour, sample_panel
from pipeline.console.server import Console, make_app
from pipeline.console.svg import line_chart, segments
from pipeline.console.views import ViewState, chosen_version
from pipeline.rewards.agreement import parse_gold
from pipeline.rewards.prm import PrmJudge
from pipeline.rewards.protocols import close_processor, run_processor, setup_processor
from tests.unit.test_console_index import sample

SVG = "{http://www.w3.org/2000/svg}"


def test_line_chart_maps_versions_and_values_onto_the_plot() -> None:
    svg = line_chart("kl", [(0, 0.0), (1, None), (2, 1.0), (4, 0.5)], marks=[2])
    root = ET.fromstring(svg)  # well-formed XML
    lines = root.findall(f"{SVG}polyline")
    # the gap at version 1 breaks the line: (0) alone, then (2, 4)
    assert [len(p.get("points", "").split()) for p in lines] == [1, 2]
    dots = [(float(c.get("cx", 0)), float(c.get("cy", 0))) for c in root.findall(f"{SVG}circle")]
    # x from 46 (v0) to 290 (v4); y from 128 (the lowest) up to 22 (the highest)
    assert dots == [(46.0, 128.0), (168.0, 22.0), (290.0, 75.0)]
    mark = root.find(f"{SVG}line[@class='mark']")
    assert mark is not None and mark.get("x1") == "168.0"
    assert [t.text for t in root.iter(f"{SVG}title")] == ["v0: 0", "v2: 1", "v4: 0.5"]


def test_line_chart_without_values_says_so_and_a_constant_sits_in_the_middle() -> None:
    assert "no data" in line_chart("kl", [(0, None), (1, None)])
    root = ET.fromstring(line_chart("kl", [(3, 2.0)]))
    assert [c.get("cy") for c in root.findall(f"{SVG}circle")] == ["75.0"]
    assert segments([(0, 1.0), (1, 2.0)]) == [[(0, 1.0), (1, 2.0)]]


def test_the_view_state_round_trips_through_its_url() -> None:
    state = ViewState(version="3", n=25, session="a b&c", sample="a b&c:4")
    url = state.url()
    query = dict(re.findall(r"([a-z]+)=([^&]*)", url.split("?", 1)[1]))
    assert ViewState.from_query({k: unquote_plus(v) for k, v in query.items()}, 50) == state
    assert ViewState().url() == "/"
    assert ViewState.from_query({"n": "9999"}, 50).n == 50
    assert ViewState.from_query({"n": "junk"}, 50).n == 10
    assert chosen_version(ViewState(), [None, 2, 7, 3]) == 7
    assert chosen_version(ViewState(version="none"), [2]) is None


def test_a_sample_panel_shows_votes_hint_mask_and_escapes_what_the_topic_holds() -> None:
    s = sample(
        5,
        -1.0,
        messages=[{"role": "user", "content": "<script>alert(1)</script>"}],
        votes=[-1, None, -1],
        hint="check the path first",
        loss_mask=0,
        exclude_reason="neutral_score",
    )
    form = ReviewForm(enabled=True, needs_token=True, back="/?sample=s2:5")
    html = sample_panel(s, None, form, "/?session=s2")
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert re.findall(r'<li class="vote">([^<]*)</li>', html) == [
        "vote 1: -1",
        "vote 2: failed (no valid score)",
        "vote 3: -1",
    ]
    assert '<p id="hint">check the path first</p>' in html
    assert "0 (excluded: neutral_score)" in html
    assert 'name="token"' in html and 'value="/?sample=s2:5"' in html
    assert "&quot;sample_id&quot;: &quot;s2:5&quot;" in html  # the raw JSON
    readonly = sample_panel(s, None, ReviewForm(False, False, "/"), "/")
    assert "review-form" not in readonly and "read-only" in readonly


def test_opd_tokens_are_coloured_by_teacher_minus_rollout() -> None:
    s = sample(
        1,
        mode="opd",
        response_ids=[11, 12, 13],
        response_logprobs=[-1.0, -1.0, -1.0],
        teacher_logprobs=[0.0, -1.0, -3.0],
    )
    html = sample_panel(s, None, ReviewForm(False, False, "/"), "/", ["He", "llo", "!"])
    tokens = re.findall(r'background:([^"]*)" title="teacher − rollout: ([^"]*)">([^<]*)<', html)
    assert tokens == [
        ("rgba(46,160,67,0.30)", "+1.000", "He"),
        ("rgba(46,160,67,0.00)", "+0.000", "llo"),
        ("rgba(218,54,51,0.60)", "-2.000", "!"),
    ]
    assert advantage_colour(-5.0, 2.0) == "rgba(218,54,51,0.60)"  # capped at full colour
    without = sample_panel(s, None, ReviewForm(False, False, "/"), "/")
    assert ">[11]<" in without  # no tokenizer: the ids stand in
    assert 'id="advantage"' not in sample_panel(sample(2), None, ReviewForm(False, False, "/"), "/")


async def test_a_review_is_a_gold_line_the_judge_agreement_reads_and_scores() -> None:
    s = sample(4, 1.0, next_state={"role": "tool", "content": "Error: file not found"})
    review = build_review(s, -1, "  the tool failed  ", ts=10.0)
    assert (review.verdict, review.note, review.judge_score) == (-1, "the tool failed", 1.0)
    line = gold_line(review)
    [item] = parse_gold([orjson.dumps(line).decode()], "reviews")
    assert item.label == -1.0
    assert item.input.next_state is not None and item.input.next_state.role == "tool"
    assert item.input.agent_output.messages[-1]["role"] == "assistant"
    judge = PrmJudge()  # the configured judge's offline default: the rules heuristic
    setup_processor(judge)
    try:
        out = await run_processor(judge, item.input)
    finally:
        await close_processor(judge)
    assert out.reward is not None and out.reward.reward_score == -1.0  # a tool error
    assert token_ok(None, None) and token_ok("k", "k")
    assert not token_ok("k", None) and not token_ok("k", "K")


async def test_the_page_and_the_api_serve_what_the_index_holds() -> None:
    index = ConsoleIndex(per_version=5)
    for i in range(12):
        index.add_sample(sample(i, float(i % 3) - 1, version=i // 6))
    status = ReaderStatus(False, "Kafka at 127.0.0.1:1 is not reachable; start it")
    app = make_app(Console(index, lambda: status, None, None))
    async with TestClient(TestServer(app)) as client:
        page = await client.get("/", params={"version": "0", "sample": "s1:4"})
        html = await page.text()
        assert page.status == 200 and 'id="status" class="error"' in html
        assert "not reachable" in html and html.count('<svg class="chart"') == 10
        assert 'id="highest"' in html and 'id="lowest"' in html
        assert 'data-sample-id="s1:4"' in html and "read-only" in html
        css = await client.get("/static/console.css")
        assert css.status == 200 and "svg.chart" in await css.text()
        raw = await client.get("/api/sample/s1:4")
        assert (await raw.json())["sample_id"] == "s1:4"
        missing = await client.get("/api/sample/nope")
        assert missing.status == 404 and "not held" in (await missing.json())["error"]
        listed = await (await client.get("/api/samples", params={"version": "1", "n": "2"})).json()
        assert [s["score"] for s in listed["highest"]] == [1.0, 1.0]
        opened = await client.get("/sample/s2:11", allow_redirects=False)
        location = urlsplit(opened.headers["Location"])
        assert (location.path, parse_qs(location.query)) == (
            "/",
            {"version": ["1"], "sample": ["s2:11"]},
        )
        refused = await client.post("/review", data={"sample_id": "s1:4", "verdict": "1"})
        assert refused.status == 403 and "read-only" in (await refused.json())["error"]
