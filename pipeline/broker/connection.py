"""Address, identity and security from settings, as both kafka-python and aiokafka take them.

Nothing here imports a Kafka client library: the aiokafka paths (replay, bulk
reads) start without loading kafka-python.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import BrokerError
from pipeline.settings import Settings


class _Masked(str):
    """A password that is a str to kafka-python but masked in a repr: kafka-python logs
    its whole config dict at debug level ("Starting KafkaAdminClient with configuration")."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'**********'"


def connection_config(settings: Settings) -> dict[str, Any]:
    """Address, identity and SASL login: the options kafka-python and aiokafka name alike."""
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
            _Masked(k.sasl_password.get_secret_value()) if k.sasl_password else None
        )
    return config


class LoginRefused(BrokerError):
    """Kafka refused the SASL login (a wrong user, password or mechanism)."""


def authentication_failed(settings: Settings, exc: BaseException) -> LoginRefused:
    """The error for a refused SASL login: where, as whom, and which settings to check."""
    k = settings.kafka
    return LoginRefused(
        f"Kafka at {settings.bootstrap_servers} refused the SASL login of user "
        f"{k.sasl_username!r} ({k.sasl_mechanism} over {k.security_protocol}): authentication "
        f"failed ({exc}). Check KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and "
        "KAFKA_SASL_MECHANISM against the broker's SCRAM credentials."
    )


def unreachable(settings: Settings) -> str:
    hint = (
        "start the local broker with `turnstream kafka start`"
        if settings.uses_local_broker
        else "check KAFKA_BOOTSTRAP_SERVERS and the KAFKA_* security settings"
    )
    return f"Kafka at {settings.bootstrap_servers} is not reachable; {hint}"


def ssl_context(settings: Settings) -> Any:
    """The TLS context of the asyncio clients (Faust, aiokafka); None without TLS."""
    import ssl

    k = settings.kafka
    if k.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(cafile=str(k.ssl_cafile) if k.ssl_cafile else None)
    if k.ssl_certfile:
        context.load_cert_chain(str(k.ssl_certfile), str(k.ssl_keyfile or "") or None)
    context.check_hostname = k.ssl_check_hostname
    return context
