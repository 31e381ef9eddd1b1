"""turnstream: online RL from live agent conversations, decoupled through Kafka."""

__version__ = "0.1.0"
