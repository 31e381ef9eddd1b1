"""`turnstream proxy` as a process: the sink, the Kafka link, the policy version, the server."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pipeline.backoff import RetryPolicy
from pipeline.errors import ConfigError
from pipeline.proxy import metrics
from pipeline.proxy.server import ProxyState, build_proxy
from pipeline.proxy.sessions import SessionCounters
from pipeline.proxy.sink import EventSink
from pipeline.settings import Settings

if TYPE_CHECKING:
    from pipeline.proxy.link import KafkaLink
    from pipeline.proxy.versions import PolicyVersions

log = logging.getLogger(__name__)


@dataclass
class FixedVersion:
    current: int | None


def run_proxy(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, with or without Kafka; then deliver (or spool) what is left."""
    from pipeline.proxy.link import KafkaLink
    from pipeline.proxy.versions import PolicyVersions

    config = settings.proxy
    topics = settings.topics
    if not config.upstream:
        raise ConfigError(
            "no upstream policy server: pass --upstream URL or set TURNSTREAM_PROXY_UPSTREAM"
        )
    resend = RetryPolicy(config.send_attempts, 1.0, config.reconnect_max_s)
    sink = EventSink(None, config.buffer, resend, config.data_dir / "spool")
    versions = _policy_versions(settings)
    follow = versions.start if isinstance(versions, PolicyVersions) else None
    link = KafkaLink(settings, sink, [topics.chat_turns.name, topics.deadletter.name], follow)
    counters = SessionCounters(config.data_dir / "sessions.sqlite")
    counters.forget_older_than(30 * 24 * 3600)
    state = ProxyState(settings, sink, counters, versions, link=link)
    sink.start()
    link.attempt(timeout_s=1.0)  # a reachable broker answers in time: start as before
    link.start()
    log.info(
        "capture proxy on http://%s:%d -> %s; turns to %s at %s; requests without X-Turn-Type "
        "are %s turns",
        config.host,
        config.port,
        config.upstream,
        topics.chat_turns.name,
        settings.bootstrap_servers,
        config.default_turn_type,
    )
    try:
        web.run_app(
            build_proxy(state),
            host=config.host,
            port=config.port,
            print=lambda line: log.info("%s", line),
            access_log=None,
            shutdown_timeout=30,
        )
    finally:
        link.stop()
        if isinstance(versions, PolicyVersions):
            versions.stop()
        stats = sink.close()
        counters.close()
        _log_stopped(state, stats, sink, link)


def _policy_versions(settings: Settings) -> FixedVersion | PolicyVersions:
    """The version the proxy stamps on turns: the one configured, or policy.versions followed."""
    from pipeline.proxy.versions import PolicyVersions

    version = settings.proxy.policy_version
    if version is None:
        return PolicyVersions(settings)
    metrics.POLICY_VERSION.set(version)
    return FixedVersion(version)


def _log_stopped(
    state: ProxyState, stats: dict[str, Any], sink: EventSink, link: KafkaLink
) -> None:
    log.info(
        "proxy stopped: %d turn(s) recorded, %d event(s) delivered, %d spooled "
        "(%d sent from the spool)",
        state.turns,
        stats["delivered"],
        stats["spooled"],
        link.drained,
    )
    waiting = sink.spool.pending(link.topics)
    if waiting:
        log.warning(
            "%d event(s) wait in the spool %s: they are sent when the proxy next reaches "
            "Kafka (or send them with `turnstream produce <file>`)",
            waiting,
            sink.spool_dir,
        )
