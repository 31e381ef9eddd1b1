"""The Kafka side: clients from settings, reading topics, and the embedded local broker.

:mod:`~pipeline.broker.reading` is the one reader of a topic range and of a
topic to its end (aiokafka); :mod:`~pipeline.broker.following` follows live
topics from plain threads and looks up partition ends (kafka-python);
:mod:`~pipeline.broker.topics_check` checks that topics exist. Which client
library is used where, and why: README.md, "Kafka clients". The kafka-python
clients are imported on first use, so the aiokafka paths
(:mod:`pipeline.broker.bulk`) start without loading kafka-python.
"""

from typing import Any

__all__ = ["admin_client", "consumer_config", "kafka_python_config", "producer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pipeline.broker import clients

        return getattr(clients, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
