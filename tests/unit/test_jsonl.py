from __future__ import annotations

from pathlib import Path

from pipeline.produce import validate_file
from pipeline.topics import load_topics
from tests.conftest import REPO
from tests.eventfiles import write_mixed_file

MAX_BYTES = load_topics(REPO / "topics.yaml").chat_turns.max_message_bytes


def test_every_bad_line_is_reported_with_number_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    valid, bad = write_mixed_file(path)
    report = validate_file(path, MAX_BYTES)
    assert report.valid == len(valid) == 4
    assert {e.line for e in report.errors} == set(bad)
    for err in report.errors:
        assert bad[err.line] in err.error, str(err)
        assert str(err).startswith(f"line {err.line}: ")


def test_progress_sees_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_mixed_file(path)
    seen: list[int] = []
    validate_file(path, MAX_BYTES, seen.append)
    assert sum(seen) == path.stat().st_size


def test_shipped_examples_validate(tmp_path: Path) -> None:
    report = validate_file(REPO / "examples" / "sessions.jsonl", MAX_BYTES)
    assert report.errors == [] and report.valid == 310
