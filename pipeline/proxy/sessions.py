"""Turn counters per session, kept on disk so a restarted proxy continues each session.

The scoring stage ignores a (session, turn_index) it has already seen, so a
counter that restarted at 0 would silently drop a resumed session's turns.
One proxy should own a session at a time (route by X-Session-Id when running
several).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path


class SessionCounters:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS sessions ("
            " session_id TEXT PRIMARY KEY, next_index INTEGER NOT NULL, last_seen REAL NOT NULL)"
        )

    def take(self, session_id: str) -> int:
        """The next turn_index of ``session_id`` (0 for a new session)."""
        row = self._db.execute(
            "INSERT INTO sessions (session_id, next_index, last_seen) VALUES (?, 1, ?) "
            "ON CONFLICT(session_id) DO UPDATE SET next_index = next_index + 1, "
            "last_seen = excluded.last_seen RETURNING next_index - 1",
            (session_id, time.time()),
        ).fetchone()
        return int(row[0])

    def peek(self, session_id: str) -> int:
        """How many turns ``session_id`` has recorded (the index its next turn takes)."""
        row = self._db.execute(
            "SELECT next_index FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def forget_older_than(self, seconds: float) -> int:
        """Drop sessions idle for longer than ``seconds``; how many were dropped."""
        cur = self._db.execute("DELETE FROM sessions WHERE last_seen < ?", (time.time() - seconds,))
        return cur.rowcount

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])

    def close(self) -> None:
        self._db.close()
