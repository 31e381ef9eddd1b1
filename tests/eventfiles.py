"""Event files with known good and bad lines, shared by the unit and kafka tiers."""

from __future__ import annotations

from pathlib import Path

import orjson


def turn(session: str, index: int, content: str = "hello") -> dict:
    return {
        "type": "turn",
        "session_id": session,
        "turn_index": index,
        "turn_type": "main",
        "messages": [{"role": "user", "content": f"question {index}"}],
        "response": {"content": content},
        "ts": 1790000000.0 + index,
    }


def write_mixed_file(path: Path) -> tuple[list[bytes], dict[int, str]]:
    """Write good and bad lines; return (valid lines as written, {bad line no: reason part})."""
    lines: list[bytes] = []
    bad: dict[int, str] = {}

    def good(event: dict) -> None:
        lines.append(orjson.dumps(event))

    def wrong(payload: bytes, reason: str) -> None:
        lines.append(payload)
        bad[len(lines)] = reason

    good(turn("sess-a", 0))
    wrong(b'{"type": "turn", "session_id": "sess-a", ', "not valid JSON")
    good(
        {
            "type": "message",
            "session_id": "sess-a",
            "ts": 5.0,
            "message": {"role": "user", "content": "thanks"},
        }
    )
    missing = turn("sess-b", 0)
    del missing["messages"]
    wrong(orjson.dumps(missing), "messages: required field is missing")
    wrong(orjson.dumps(dict(turn("sess-b", 1), turn_index="one")), "turn_index")
    wrong(orjson.dumps(turn("sess-c", 0, content="x" * (10 * 1024 * 1024))), "max.message.bytes")
    wrong(b'{"type": "session_end", "session_id": "sess-\xff", "ts": 1}', "not valid UTF-8")
    good(turn("sess-b", 2))
    good({"type": "session_end", "session_id": "sess-a", "ts": 9.0})
    path.write_bytes(b"\n".join(lines) + b"\n\n")
    valid = [line for no, line in enumerate(lines, start=1) if no not in bad]
    return valid, bad
