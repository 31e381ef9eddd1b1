"""Letting an event loop catch up in tests of pure asyncio code (no I/O, no clock)."""

from __future__ import annotations

import asyncio


async def settle(rounds: int = 100) -> None:
    """Let the loop run what is ready, and what that makes ready, ``rounds`` deep.

    In code that waits on no I/O and no clock, whatever a task does next is done by then,
    however busy the machine: a check after it ("nothing acknowledged yet") is not a race
    with it, as after a 10 ms sleep, which a loaded machine can spend in a single round.
    """
    for _ in range(rounds):
        await asyncio.sleep(0)
