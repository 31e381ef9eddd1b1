"""kafka-python clients built from settings (address and security: see ``connection``).

Every client gets a connection manager that repairs kafka-python's SASL login
(:class:`_AuthFailsFastManager`): it overrides the manager's private
``_connect``, wraps the connection's ``_sasl_authenticate`` and writes the
manager's ``_auth_failures``, the attributes of kafka-python 3.0. The first
client built checks that the installed kafka-python is a tested version, so an
untested one is a clear error rather than a login retried until the bootstrap
times out. Tested by tests/kafka/test_security.py (a wrong password fails fast).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaConnectionError, KafkaError, SaslAuthenticationFailedError
from kafka.net.compat import KafkaNetClient
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector

from pipeline.broker.connection import (
    authentication_failed,
    connection_config,
    ssl_context,
    unreachable,
)
from pipeline.broker.gzip_level import use_gzip_level
from pipeline.errors import BrokerError
from pipeline.library_versions import require_tested
from pipeline.settings import Settings

# _AuthFailsFastManager's kafka-python: its manager's _connect and _auth_failures
TESTED: dict[str, tuple[str, ...]] = {"kafka-python": ("3.0.",)}
_checked = False  # set by the first client built (any thread: a second check is harmless)


def check_versions(installed: Mapping[str, str] | None = None) -> dict[str, str]:
    """The installed kafka-python's version; ConfigError when it was never tested with the
    SASL login repair (``installed``: a version to check instead)."""
    return require_tested(
        TESTED,
        "the SASL login repair of kafka-python's connection manager (pipeline/broker/clients.py)",
        "tests/kafka/test_security.py",
        installed,
    )


class _AuthFailsFastManager(KafkaConnectionManager):
    """Makes a refused SASL login the node's sticky auth failure, as kafka-python intends.

    kafka-python 3.0 caches such a failure to raise it on the next connection
    attempt, but its connect path never sees it (the error only reaches the
    connection's init future), and when the broker's close arrives with its
    error response the response is dropped ("socket disconnected"). Either way
    a wrong password was retried until the bootstrap timed out, one failed login
    a backoff. Here a refused login, or a second login in a row the broker hangs
    up on, is recorded, and the next attempt raises it.
    """

    LOGIN_HANGUPS = 2

    def __init__(self, net: Any, **configs: Any) -> None:
        super().__init__(net, **configs)
        self._login_hangups: dict[Any, int] = {}

    async def _connect(self, node: Any, conn: Any, *args: Any, **kwargs: Any) -> None:
        failures: list[KafkaError] = []
        login = conn._sasl_authenticate

        async def noted_login(*a: Any, **kw: Any) -> Any:
            try:
                return await login(*a, **kw)
            except (SaslAuthenticationFailedError, KafkaConnectionError) as exc:
                failures.append(exc)
                raise

        conn._sasl_authenticate = noted_login
        await super()._connect(node, conn, *args, **kwargs)
        hangups = self._login_hangups
        if not failures:
            hangups.pop(node.node_id, None)
        elif isinstance(failures[0], SaslAuthenticationFailedError):
            self._auth_failures[node.node_id] = failures[0]
        else:
            hangups[node.node_id] = hangups.get(node.node_id, 0) + 1
            if hangups[node.node_id] >= self.LOGIN_HANGUPS:
                self._auth_failures[node.node_id] = SaslAuthenticationFailedError(
                    f"the broker closed the connection during the SASL login "
                    f"{hangups[node.node_id]} times in a row ({failures[0]})"
                )


def _net_client(**configs: Any) -> KafkaNetClient:
    """The ``kafka_client`` factory of every kafka-python client we build."""
    global _checked
    if not _checked:
        check_versions()
        _checked = True
    net = NetworkSelector(**configs)
    return KafkaNetClient(net=net, manager=_AuthFailsFastManager(net, **configs), **configs)


def kafka_python_config(settings: Settings) -> dict[str, Any]:
    """Connection and security options shared by every kafka-python client."""
    k = settings.kafka
    config: dict[str, Any] = {
        **connection_config(settings),
        "kafka_client": _net_client,
        # kafka-python backs off exponentially up to 30 s between reconnects: after a broker
        # restart a producer could wait that long to notice it is back
        "reconnect_backoff_max_ms": 1000,
    }
    if k.security_protocol in ("SSL", "SASL_SSL"):
        config["ssl_cafile"] = str(k.ssl_cafile) if k.ssl_cafile else None
        config["ssl_certfile"] = str(k.ssl_certfile) if k.ssl_certfile else None
        config["ssl_keyfile"] = str(k.ssl_keyfile) if k.ssl_keyfile else None
        config["ssl_check_hostname"] = k.ssl_check_hostname
    return config


def admin_client(settings: Settings, timeout_ms: int = 15000) -> KafkaAdminClient:
    try:
        return KafkaAdminClient(
            **kafka_python_config(settings),
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
        )
    except SaslAuthenticationFailedError as exc:
        raise authentication_failed(settings, exc) from exc
    except KafkaError as exc:
        raise BrokerError(f"{unreachable(settings)} ({exc!r})") from exc


def check_access(settings: Settings) -> None:
    """Connect and log in once, so a wrong address or password fails before a slow start-up."""
    admin_client(settings).close()


def producer(settings: Settings, max_request_size: int, **overrides: Any) -> KafkaProducer:
    """An idempotent, acks=all producer; callers key by session_id."""
    use_gzip_level(settings.producer_gzip_level, "kafka-python")
    options: dict[str, Any] = {
        **kafka_python_config(settings),
        "acks": "all",
        "enable_idempotence": True,
        "compression_type": None
        if settings.producer_compression == "none"
        else settings.producer_compression,
        "linger_ms": settings.producer_linger_ms,
        "max_request_size": max_request_size,
        "retries": 2**31 - 1,
        "delivery_timeout_ms": 120000,
        **overrides,
    }
    try:
        return KafkaProducer(**options)
    except SaslAuthenticationFailedError as exc:
        raise authentication_failed(settings, exc) from exc
    except KafkaError as exc:
        raise BrokerError(f"{unreachable(settings)} ({exc!r})") from exc


def consumer_config(settings: Settings, group_id: str | None, **overrides: Any) -> dict[str, Any]:
    """Options for a KafkaConsumer: manual commits, start from the earliest offset."""
    return {
        **kafka_python_config(settings),
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        **overrides,
    }


def flush_or_raise(prod: KafkaProducer, futures: list[Any], what: str) -> None:
    """Flush, then fail loudly if any of ``futures`` was not delivered (before a commit)."""
    prod.flush()
    failed = [f for f in futures if f.failed()]
    futures.clear()
    if failed:
        raise BrokerError(f"{len(failed)} {what} could not be delivered: {failed[0].exception!r}")


def faust_credentials(settings: Settings) -> Any:
    """Faust broker credentials from the same KAFKA_* settings every client uses."""
    import faust

    k = settings.kafka
    context = ssl_context(settings)
    if k.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password.get_secret_value() if k.sasl_password else None,
            mechanism=k.sasl_mechanism,
            ssl_context=context,
        )
    return faust.SSLCredentials(context) if context else None
