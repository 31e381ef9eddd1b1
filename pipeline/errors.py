"""The one root exception of turnstream and its direct kinds.

Every error raised at a boundary (a file, a topic, a broker, a server) says what
was wrong, where, and what to do about it.
"""


class TurnstreamError(Exception):
    """Root of every error turnstream raises on purpose."""


class ConfigError(TurnstreamError):
    """A settings value, topics.yaml or another config file is wrong."""


class EventDecodeError(TurnstreamError):
    """An event could not be decoded or failed validation.

    ``field`` is the dotted path of the offending field ("" for the whole event)
    and ``problem`` says what is wrong with it.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class BrokerError(TurnstreamError):
    """The Kafka broker could not be started, reached or changed."""


class TopicPlanError(TurnstreamError):
    """topics.yaml asks for a change Kafka cannot make (fewer partitions, new RF)."""


class RewardError(TurnstreamError):
    """A reward processor could not be loaded, or broke its contract (wrong output, length)."""


class RolloutError(TurnstreamError):
    """A rollout processor or its traced client was used against its contract."""
