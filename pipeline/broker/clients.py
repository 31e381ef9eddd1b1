"""Kafka client construction from settings: one place for address and security."""

from __future__ import annotations

from typing import Any

from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaError

from pipeline.errors import BrokerError
from pipeline.settings import Settings


def kafka_python_config(settings: Settings) -> dict[str, Any]:
    """Connection and security options shared by every kafka-python client."""
    k = settings.kafka
    config: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers.split(","),
        "client_id": settings.client_id,
        "security_protocol": k.security_protocol,
    }
    if k.sasl_mechanism:
        config["sasl_mechanism"] = k.sasl_mechanism
        config["sasl_plain_username"] = k.sasl_username
        config["sasl_plain_password"] = (
            k.sasl_password.get_secret_value() if k.sasl_password else None
        )
    if k.security_protocol in ("SSL", "SASL_SSL"):
        config["ssl_cafile"] = str(k.ssl_cafile) if k.ssl_cafile else None
        config["ssl_certfile"] = str(k.ssl_certfile) if k.ssl_certfile else None
        config["ssl_keyfile"] = str(k.ssl_keyfile) if k.ssl_keyfile else None
        config["ssl_check_hostname"] = k.ssl_check_hostname
    return config


def _where(settings: Settings) -> str:
    hint = (
        "start the local broker with `turnstream kafka start`"
        if settings.uses_local_broker
        else "check KAFKA_BOOTSTRAP_SERVERS and the KAFKA_* security settings"
    )
    return f"Kafka at {settings.bootstrap_servers} is not reachable; {hint}"


def admin_client(settings: Settings, timeout_ms: int = 15000) -> KafkaAdminClient:
    try:
        return KafkaAdminClient(
            **kafka_python_config(settings),
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
        )
    except KafkaError as exc:
        raise BrokerError(f"{_where(settings)} ({exc!r})") from exc


def producer(settings: Settings, max_request_size: int, **overrides: Any) -> KafkaProducer:
    """An idempotent, acks=all producer; callers key by session_id."""
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
    except KafkaError as exc:
        raise BrokerError(f"{_where(settings)} ({exc!r})") from exc


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
