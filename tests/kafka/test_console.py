"""`turnstream console` on the real broker, in a real browser (Debian's headless Chromium,
driven by selenium through chromium-driver): charts and lists render, a click opens a
sample with its votes and hint, a verdict lands on reviews, a reload keeps the view; the
review token; and `judge agreement --from-reviews` closing the loop."""

from __future__ import annotations

import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from kafka import KafkaProducer

from pipeline.broker.local import free_port_pair
from pipeline.events import JudgeIdentity, Response, Review, Sample, decode_as, encode
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.kafka.helpers import read_all, spawn, turnstream, wait_http

TOKEN = "review-secret"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def scored(i: int, version: int, score: float, next_state: dict[str, str], **fields: Any) -> Sample:
    base: dict[str, Any] = {
        "sample_id": f"sess-{i}:{i}",
        "session_id": f"sess-{i}",
        "turn_index": i,
        "messages": [{"role": "user", "content": f"task number {i}"}],
        "response": Response(content=f"answer {i} " + "word " * (i % 5)),
        "next_state": next_state,
        "score": score,
        "votes": [1, 1] if score > 0 else [-1, None, -1],
        "judge_calls": 2 if score > 0 else 3,
        "exclude_reason": None,
        "loss_mask": 1,
        "mode": "rl",
        "policy_version": version,
        "judge": JudgeIdentity(backend="rules", prompt_version="v1"),
    }
    return Sample(**{**base, **fields})


THANKS = {"role": "user", "content": "Thanks, that worked!"}
TOOL_ERROR = {"role": "tool", "content": "Error: file not found"}


def samples() -> list[Sample]:
    out = [
        scored(
            i,
            version=i % 3,
            score=1.0 if i % 2 else -1.0,
            next_state=THANKS if i % 2 else TOOL_ERROR,
        )
        for i in range(18)
    ]
    out.append(  # version 2's lowest: an OPD sample with a hint and per-token teacher log-probs
        scored(
            100,
            version=2,
            score=-1.0,
            next_state=TOOL_ERROR,
            mode="opd",
            hint="Check that the file exists before reading it.",
            response_ids=[11, 12, 13],
            response_logprobs=[-1.0, -2.0, -0.5],
            teacher_logprobs=[-0.2, -3.0, -0.5],
        )
    )
    return out


def publish(settings: Settings) -> list[Sample]:
    admin.apply(settings)
    raw = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    written = samples()
    for s in written:
        raw.send(settings.topics.samples_scored.name, key=s.session_id.encode(), value=encode(s))
    for version in (1, 2, 3):
        metrics = {
            "reward_mean": 0.1 * version,
            "teacher_gap": 0.0,
            "response_length": 12.0 + version,
            "entropy": 1.5 - 0.1 * version,
            "kl": 0.01 * version,
        }
        record = {
            "version": version,
            "path": f"/w/v{version}",
            "step": version,
            "ts": 1e9 + version,
            "step_metrics": metrics,
            "push": None,
        }
        raw.send(settings.topics.policy_versions.name, key=b"policy", value=orjson.dumps(record))
    raw.flush()
    raw.close()
    return written


@pytest.fixture
def console_url(settings: Settings, cli_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    """A `turnstream console --reviews` with a token, over published samples."""
    publish(settings)
    port = free_port_pair()
    env = {**cli_env, "TURNSTREAM_CONSOLE_TOKEN": TOKEN}
    proc = spawn(
        ["pipeline.cli", "console", "--port", str(port), "--reviews"], tmp_path / "console.log", env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/api/status", proc)
        deadline = time.monotonic() + 60
        while "caught up" not in get_json(url + "/api/status")["text"]:
            assert time.monotonic() < deadline, (tmp_path / "console.log").read_text()
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def get_json(url: str) -> Any:
    return orjson.loads(urllib.request.urlopen(url, timeout=10).read())


def post_review(url: str, body: dict[str, Any], token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url + "/review", data=orjson.dumps(body), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=20) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def reviews_on_topic(settings: Settings) -> list[tuple[bytes, Review]]:
    return [
        (r.key, decode_as(Review, r.value))
        for r in read_all(settings, settings.topics.reviews.name)
    ]


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None or DRIVER is None:
        pytest.skip(
            "Chromium is not installed: deploy/local/system-deps.sh installs chromium and "
            "chromium-driver"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2200",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def click_and_wait(driver: Any, element: Any) -> None:
    """Click, then wait until the page it leads to has replaced this one."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 20).until(expected_conditions.staleness_of(page))


def view_of(url: str) -> tuple[str, dict[str, list[str]]]:
    """A page's view: its path and query (however its characters are quoted)."""
    parts = urlsplit(url)
    return parts.path, parse_qs(parts.query)


def listed(driver: Any, list_id: str) -> list[str]:
    from selenium.webdriver.common.by import By

    items = driver.find_elements(By.CSS_SELECTOR, f"#{list_id} li[data-sample-id]")
    return [li.get_attribute("data-sample-id") for li in items]


def test_the_console_in_a_browser(
    console_url: str, browser: Any, settings: Settings, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(console_url + "/?version=2")
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) == 10
    # the trainer's figures: records 1, 2, 3 describe versions 0, 1, 2
    assert charts[0].get_attribute("aria-label") == "train reward mean (trainer)"
    assert len(charts[0].find_elements(By.CSS_SELECTOR, "circle.dot")) == 3
    assert len(charts[0].find_elements(By.CSS_SELECTOR, "polyline")) == 1
    rows = browser.find_elements(By.CSS_SELECTOR, "table#versions tbody tr")
    assert [r.get_attribute("data-version") for r in rows] == ["3", "2", "1", "0"]
    highest, lowest = listed(browser, "highest"), listed(browser, "lowest")
    assert set(highest[:3]) == {"sess-5:5", "sess-11:11", "sess-17:17"}  # the +1s of version 2
    assert set(lowest[:4]) == {"sess-2:2", "sess-8:8", "sess-14:14", "sess-100:100"}

    link = browser.find_element(By.CSS_SELECTOR, '#lowest li[data-sample-id="sess-100:100"] a')
    click_and_wait(browser, link)
    detail = browser.find_element(By.ID, "sample-detail")
    assert detail.get_attribute("data-sample-id") == "sess-100:100"
    votes = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#votes li")]
    assert votes == ["vote 1: -1", "vote 2: failed (no valid score)", "vote 3: -1"]
    assert (
        browser.find_element(By.ID, "hint").text == "Check that the file exists before reading it."
    )
    tokens = browser.find_elements(By.CSS_SELECTOR, "#advantage .tok")
    assert [t.get_attribute("title") for t in tokens] == [
        "teacher − rollout: +0.800",
        "teacher − rollout: -1.000",
        "teacher − rollout: +0.000",
    ]
    assert "Error: file not found" in browser.find_element(By.ID, "next-state").text
    assert "session=sess-100" in browser.find_element(By.ID, "session-link").get_attribute("href")
    opened = browser.current_url
    assert view_of(opened) == ("/", {"version": ["2"], "sample": ["sess-100:100"]})

    browser.find_element(By.CSS_SELECTOR, "#review-form textarea[name=note]").send_keys(
        "a tool error: -1 is right"
    )
    browser.find_element(By.CSS_SELECTOR, "#review-form input[name=token]").send_keys(TOKEN)
    click_and_wait(browser, browser.find_element(By.ID, "verdict-bad"))
    assert browser.find_element(By.ID, "verdict").text.startswith("reviewed: -1")
    assert view_of(browser.current_url) == view_of(opened)  # back on the same view
    [(key, review)] = reviews_on_topic(settings)
    assert key == b"sess-100:100"
    assert (review.verdict, review.note, review.judge_score) == (
        -1,
        "a tool error: -1 is right",
        -1.0,
    )
    assert review.next_state is not None and review.next_state.content == "Error: file not found"

    browser.refresh()
    assert view_of(browser.current_url) == view_of(opened)
    assert (
        browser.find_element(By.ID, "sample-detail").get_attribute("data-sample-id")
        == "sess-100:100"
    )
    assert browser.find_element(By.ID, "verdict").text.startswith("reviewed: -1")
    assert set(listed(browser, "lowest")[:4]) == set(lowest[:4])
    shot = tmp_path / "console.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"console screenshot: {shot}")


def test_a_review_needs_the_token_and_lands_on_reviews(
    console_url: str, settings: Settings
) -> None:
    body = {"sample_id": "sess-3:3", "verdict": 1, "note": "fine"}
    status, answer = post_review(console_url, body, None)
    assert status == 401 and "console token" in answer["error"]
    assert post_review(console_url, body, "wrong")[0] == 401
    assert post_review(console_url, {**body, "sample_id": "nope"}, TOKEN)[0] == 404
    status, answer = post_review(console_url, {**body, "verdict": 2}, TOKEN)
    assert status == 400 and "verdict" in answer["error"]
    status, answer = post_review(console_url, body, TOKEN)
    assert status == 200 and answer["topic"] == settings.topics.reviews.name
    # the accepted review is the marker: a refused one written before it would be before it
    assert [(k, r.verdict, r.note) for k, r in reviews_on_topic(settings)] == [
        (b"sess-3:3", 1, "fine")
    ]


def test_judge_agreement_from_reviews_scores_the_judge_against_them(
    console_url: str, settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # the configured judge (rules, offline): "Thanks" -> +1, a tool error -> -1
    verdicts = {"sess-1:1": 1, "sess-2:2": -1, "sess-4:4": 1}  # on sess-4:4 the human differs
    assert post_review(console_url, {"sample_id": "sess-1:1", "verdict": -1}, TOKEN)[0] == 200
    for sample_id, verdict in verdicts.items():  # sess-1:1 again: the latest verdict counts
        assert (
            post_review(console_url, {"sample_id": sample_id, "verdict": verdict}, TOKEN)[0] == 200
        )
    gold = tmp_path / "gold.jsonl"
    result = turnstream(
        "judge", "agreement", "--from-reviews", "--write-gold", str(gold), env=cli_env
    )
    assert result.returncode == 0, result.stderr
    assert f"gold set: topic {settings.topics.reviews.name} (3 labelled inputs)" in result.stdout
    # labels -1, +1, +1 against -1, +1, -1: po 2/3, pe 4/9, kappa (2/3 - 4/9) / (5/9) = 0.4
    assert "Cohen kappa:  0.4000" in result.stdout
    lines = [orjson.loads(line) for line in gold.read_text().splitlines()]
    assert {line["request_metadata"]["sample_id"]: line["label"] for line in lines} == verdicts


def test_the_console_says_at_start_when_the_broker_is_unreachable(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port_pair()}"}
    result = turnstream("console", "--port", str(free_port_pair()), env=env, timeout=120)
    assert result.returncode == 1
    assert "is not reachable" in result.stderr and "KAFKA_BOOTSTRAP_SERVERS" in result.stderr


def test_the_console_says_which_topics_are_missing(cli_env: dict[str, str]) -> None:
    result = turnstream("console", "--port", str(free_port_pair()), env=cli_env, timeout=120)
    assert result.returncode == 1
    assert "do not exist" in result.stderr and "turnstream topics apply" in result.stderr
