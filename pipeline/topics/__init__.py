"""topics.yaml: the one source of topic names, partitions and configs."""

from pipeline.topics.spec import REQUIRED_TOPICS, Topics, TopicSpec, load_topics

__all__ = ["REQUIRED_TOPICS", "TopicSpec", "Topics", "load_topics"]
