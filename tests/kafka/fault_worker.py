"""A scoring worker with one fault injected at a chosen instant, for the kill-point tests.

A test double, run as ``python -m tests.kafka.fault_worker [worker flags]`` with
``TURNSTREAM_TEST_HOLD`` naming what never completes:

- ``pair:<sample_id>``: that pair is handed to the producer but never stored
  (the worker is then killed while the pair is in flight);
- ``state:<session_id>:<turn_index>``: the session-table changelog record whose
  pending turn is ``turn_index`` is never stored (killed after the pairs were).

When the hold engages, ``TURNSTREAM_TEST_MARK`` (a file path) is written.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pipeline.scoring.worker as worker_app
from pipeline.events import Paired, decode_as
from pipeline.scoring.faust_fixes.sessions import SessionTable

MARK = Path(os.environ["TURNSTREAM_TEST_MARK"])


def never_stored(what: str) -> asyncio.Future[Any]:
    MARK.write_text(what)
    return asyncio.get_running_loop().create_future()


def hold_pair(sample_id: str) -> None:
    build = worker_app.build_app

    def build_app(settings: Any, judging: Any, sender: Any = None, **kwargs: Any) -> Any:
        paired = settings.topics.turns_paired.name
        real: list[Any] = []

        async def send(outs: list[Any]) -> list[Any]:
            stored = []
            for out in outs:
                if out.topic == paired and decode_as(Paired, out.value).sample_id == sample_id:
                    stored.append(never_stored(f"pair {sample_id}"))
                else:
                    stored.extend(await real[0]([out]))
            return stored

        app = build(settings, judging, sender=send, **kwargs)
        real.append(worker_app.kafka_sender(app))
        return app

    worker_app.build_app = build_app


def hold_state(session_id: str, turn_index: int) -> None:
    persisting = SessionTable.persisting

    def held_here(sid: str, state: Any) -> bool:
        pending = (state or {}).get("pending") or {}
        return sid == session_id and pending.get("turn_index") == turn_index

    def held(self: SessionTable, writes: dict[tuple[int, str], Any]) -> Any:
        if not any(held_here(sid, state) for (_, sid), state in writes.items()):
            return persisting(self, writes)
        rest = persisting(self, {k: v for k, v in writes.items() if not held_here(k[1], v)})

        async def step() -> list[Any]:
            stored = await rest() if rest else []
            return [*stored, never_stored(f"state of {session_id} with pending turn {turn_index}")]

        return step

    SessionTable.persisting = held  # type: ignore[method-assign]


def main() -> None:
    kind, _, what = os.environ["TURNSTREAM_TEST_HOLD"].partition(":")
    if kind == "pair":
        hold_pair(what)
    else:
        session_id, _, index = what.rpartition(":")
        hold_state(session_id, int(index))
    from pipeline.cli import main as turnstream

    sys.argv = ["turnstream", "worker", *sys.argv[1:]]
    turnstream()


if __name__ == "__main__":
    main()
