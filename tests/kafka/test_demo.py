from __future__ import annotations

import re

from pipeline.settings import Settings
from tests.kafka.helpers import read_all, turnstream


def test_demo_applies_topics_sends_examples_and_counts(
    settings: Settings, cli_env: dict[str, str]
) -> None:
    result = turnstream("demo", env=cli_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"using the cluster at {settings.bootstrap_servers}" in result.stdout
    assert "sent 310 events" in result.stdout
    assert _counts(result.stdout, "chat.turns") == (310, 310)
    assert _counts(result.stdout, "samples.scored") == (0, 0)
    assert len(read_all(settings, settings.topics.chat_turns.name)) == 310
    again = turnstream("demo", env=cli_env)
    assert "topics: already match topics.yaml" in again.stdout
    assert _counts(again.stdout, "chat.turns") == (310, 620)
    assert len(read_all(settings, settings.topics.chat_turns.name)) == 620


def _counts(table: str, topic: str) -> tuple[int, int]:
    """(this run, total) from the demo's table row of ``topic``."""
    row = next(line for line in table.splitlines() if f".{topic} " in line)
    this_run, total = re.findall(r"\b(\d+)\b", row.split(topic, 1)[1])
    return int(this_run), int(total)
