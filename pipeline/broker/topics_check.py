"""Checks that the pipeline's topics exist, before a process starts on them."""

from __future__ import annotations

from pipeline.broker.clients import admin_client
from pipeline.errors import BrokerError
from pipeline.settings import Settings


def require_topics(settings: Settings, names: list[str], timeout_s: float = 15.0) -> None:
    """Fail early, and say what to run, when the pipeline's topics do not exist."""
    admin = admin_client(settings, timeout_ms=int(timeout_s * 1000))
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    missing = [n for n in names if n not in existing]
    if missing:
        raise BrokerError(
            f"topic(s) {missing} do not exist on {settings.bootstrap_servers}; "
            "create them with `turnstream topics apply`"
        )
