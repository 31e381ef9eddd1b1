"""The Kafka side: client configuration and the embedded local broker."""

from pipeline.broker.clients import admin_client, consumer_config, kafka_python_config, producer

__all__ = ["admin_client", "consumer_config", "kafka_python_config", "producer"]
