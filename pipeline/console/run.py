"""`turnstream console`'s process: check the broker, start the reader, serve the page."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from aiohttp import web

from pipeline.broker.clients import check_access
from pipeline.broker.topics_check import require_topics
from pipeline.console.index import ConsoleIndex
from pipeline.console.reader import ConsoleReader
from pipeline.console.server import Console, ReviewSink, make_app
from pipeline.settings import Settings

log = logging.getLogger(__name__)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def review_token(settings: Settings) -> str | None:
    """The token a review must carry: the console's, else the proxy's api_key, else none."""
    secret = settings.console.token or settings.proxy.api_key
    return secret.get_secret_value() if secret is not None else None


def tokenizer_pieces(path: Path) -> Callable[[Sequence[int]], list[str]]:
    """Token ids -> the text of each, by the policy's tokenizer (loaded once, now)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return lambda ids: [str(tokenizer.decode([i])) for i in ids]


def build_console(
    settings: Settings, reviews: bool, tokenizer: Path | None
) -> tuple[Console, ConsoleReader]:
    """The console's parts, after checking that the broker answers and the topics exist
    (each failure a BrokerError saying what to do)."""
    check_access(settings)
    t = settings.topics
    require_topics(settings, [t.samples_scored.name, t.policy_versions.name, t.reviews.name])
    c = settings.console
    index = ConsoleIndex(c.max_samples, c.per_version, c.max_versions)
    reader = ConsoleReader(settings, index)
    token = review_token(settings)
    sink = ReviewSink(settings) if reviews or token is not None else None
    pieces = tokenizer_pieces(tokenizer) if tokenizer is not None else None
    return Console(index, lambda: reader.status, sink, token, pieces), reader


def describe(console: Console, host: str, port: int) -> str:
    where = f"turnstream console at http://{host}:{port}/"
    if console.sink is None:
        return f"{where} (read-only: --reviews or TURNSTREAM_CONSOLE_TOKEN to record verdicts)"
    if console.token is None:
        return f"{where} (reviews on {console.sink.topic}, no token asked)"
    return f"{where} (reviews on {console.sink.topic} need the token)"


def run_console(
    settings: Settings, host: str, port: int, reviews: bool, tokenizer: Path | None
) -> None:
    """Serve the console until interrupted."""
    console, reader = build_console(settings, reviews, tokenizer)
    if console.sink is not None and console.token is None and host not in LOOPBACK:
        log.warning(
            "reviews are open to anyone who reaches %s:%d: set TURNSTREAM_CONSOLE_TOKEN", host, port
        )
    reader.start()
    try:
        print(describe(console, host, port), flush=True)
        web.run_app(make_app(console), host=host, port=port, print=None, access_log=None)
    finally:
        reader.stop()
        if console.sink is not None:
            console.sink.close()
