"""The Kafka side: client configuration and the embedded local broker.

The kafka-python clients are imported on first use, so the aiokafka paths
(:mod:`pipeline.broker.bulk`) start without loading kafka-python.
"""

from typing import Any

__all__ = ["admin_client", "consumer_config", "kafka_python_config", "producer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pipeline.broker import clients

        return getattr(clients, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
