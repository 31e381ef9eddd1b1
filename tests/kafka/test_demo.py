from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.events import Sample, SessionEnd, Turn, decode_as, decode_input
from pipeline.settings import Settings
from tests.conftest import REPO
from tests.kafka.helpers import read_all, turnstream

EXAMPLES = REPO / "examples" / "sessions.jsonl"


def test_demo_runs_the_pipeline_through_scoring(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path
) -> None:
    result = turnstream(
        "demo", "--recorded", "--workdir", str(tmp_path / "demo"), env=cli_env, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"using the cluster at {settings.bootstrap_servers}" in out
    assert "judge: rules (a deterministic heuristic judge" in out
    assert "sent 310 events" in out
    assert _counts(out, "chat.turns") == (310, 310)
    assert _counts(out, "turns.paired") == (209, 209)
    assert _counts(out, "samples.scored") == (209, 209)
    scored = [
        decode_as(Sample, r.value) for r in read_all(settings, settings.topics.samples_scored.name)
    ]
    by_score = {f"{s:+g}": n for s, n in Counter(x.score for x in scored).items()}
    for score, n in by_score.items():
        assert re.search(rf"samples scored {re.escape(score)}\s*│\s*{n}\b", out), score
    excluded = Counter(x.exclude_reason for x in scored if x.exclude_reason)
    assert re.search(rf"excluded: no_next_state\s*│\s*{excluded['no_next_state']}\b", out)
    included = sum(1 for x in scored if x.loss_mask == 1)
    assert re.search(rf"samples trained\s*│\s*{included}\b", out), out[-2500:]
    versions = read_all(settings, settings.topics.policy_versions.name)
    assert re.search(rf"policy version\s*│\s*{len(versions)}\b", out)
    assert "started a scoring worker and a trainer" in out
    votes = Counter("failed" if v is None else f"{v:+d}" for x in scored for v in x.votes)
    for value, n in votes.items():
        assert re.search(rf"judge votes {re.escape(value)}\s*│\s*{n}\b", out), value
    chart = tmp_path / "demo" / "demo.png"
    assert f"chart: {chart}" in out.replace("\n", "")
    png = chart.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1300, 380)
    assert _leftovers(tmp_path / "demo") == []
    again = turnstream(
        "demo", "--recorded", "--workdir", str(tmp_path / "demo"), env=cli_env, timeout=600
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "topics: already match topics.yaml" in again.stdout
    assert _counts(again.stdout, "chat.turns") == (310, 620)
    # The same events again: sessions still open remember their turns and ignore
    # them as duplicates; sessions that ended were forgotten and pair again.
    # (A restart may re-pair a few more: at-least-once, same sample_ids.)
    repaired = _main_turns_of_ended_sessions()
    assert 0 < repaired < 209
    this_run, total = _counts(again.stdout, "samples.scored")
    assert repaired <= this_run < 209 and total == 209 + this_run
    # Their sample_ids were trained already: the trainer skips them all.
    assert "samples trained" not in again.stdout


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_stopping_the_demo_stops_everything_it_started(
    settings: Settings, cli_env: dict[str, str], tmp_path: Path, how: signal.Signals
) -> None:
    workdir = tmp_path / "demo"
    log = tmp_path / "demo.log"
    # A judge that accepts connections and never answers: no pair is judged, so the
    # demo cannot finish before the signal, however slow or fast the machine is.
    silent = socket.create_server(("127.0.0.1", 0), backlog=256)
    judge = {
        "TURNSTREAM_SCORING_JUDGE": "sglang",
        "TURNSTREAM_SCORING_JUDGE_URLS": f"http://127.0.0.1:{silent.getsockname()[1]}",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "demo", "--recorded", "--workdir", str(workdir)],
            env={**cli_env, **judge, "PYTHONPATH": os.getcwd()},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "sent 310 events" not in log.read_text() or len(_leftovers(workdir)) < 3:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        os.kill(proc.pid, how)  # SIGINT is what Ctrl-C sends to the foreground process
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        silent.close()
    assert "judge: sglang at http://127.0.0.1:" in log.read_text()
    if how == signal.SIGINT:
        assert code == 130, log.read_text()[-3000:]
        assert "interrupted: stopped everything this demo started" in log.read_text()
    deadline = time.monotonic() + 60  # after kill -9 the children get SIGTERM and stop
    while (left := _leftovers(workdir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []


def _leftovers(workdir: Path) -> list[str]:
    """Command lines of live processes that belong to this demo (its worker, its trainer)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        if cmdline.parent.name == str(os.getpid()):
            continue
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(args).decode(errors="replace")
        if str(workdir) in text:
            found.append(text)
    return found


def _main_turns_of_ended_sessions() -> int:
    events = [decode_input(line) for line in EXAMPLES.read_bytes().splitlines()]
    ended = {e.session_id for e in events if isinstance(e, SessionEnd)}
    return sum(
        1 for e in events if isinstance(e, Turn) and e.turn_type == "main" and e.session_id in ended
    )


def _counts(table: str, topic: str) -> tuple[int, int]:
    """(this run, total) from the demo's table row of ``topic``."""
    row = next(line for line in table.splitlines() if f".{topic} " in line and "│" in line)
    this_run, total = re.findall(r"\b(\d+)\b", row.split(topic, 1)[1])
    return int(this_run), int(total)
