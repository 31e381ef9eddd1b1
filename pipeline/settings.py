"""Process settings, read once from the environment (and an optional YAML file).

``KAFKA_*`` variables describe the cluster and client security; ``TURNSTREAM_*``
the rest. When ``KAFKA_BOOTSTRAP_SERVERS`` is unset, the embedded local broker
(``turnstream kafka start``) is used. A YAML key that is no setting is an error;
a ``TURNSTREAM_*`` variable that is none is a warning (other tools share the
environment, so a variable alone cannot stop a process).

Every settings class is imported from here. The sections of the parts that stand in for a
cluster on one machine (broker, policy server, models) are defined in
:mod:`pipeline.settings_embedded`, and the base class and the YAML source in
:mod:`pipeline.settings_sources`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    NoDecode,
    SettingsConfigDict,
    SettingsError,
)

from pipeline import settings_sources
from pipeline.errors import ConfigError
from pipeline.settings_embedded import LocalKafkaSettings, ModelSettings, ServeSettings
from pipeline.settings_sources import (
    READ_DIRECTLY,
    REPO_ROOT,
    EnvThenFile,
    config_path,
    shipped_file,
)
from pipeline.topics.spec import Topics, load_topics

__all__ = [
    "READ_DIRECTLY",
    "REPO_ROOT",
    "ConsoleSettings",
    "KafkaSettings",
    "LocalKafkaSettings",
    "ModelSettings",
    "ProxySettings",
    "ScoringSettings",
    "ServeSettings",
    "Settings",
    "load_settings",
    "setting_variables",
    "shipped_file",
]


class KafkaSettings(EnvThenFile):
    """Where the cluster is and how clients authenticate to it."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_", frozen=True, extra="forbid")

    bootstrap_servers: str | None = Field(
        None, description="host:port[,host:port]; unset means the embedded local broker"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_check_hostname: bool = True

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_port_list(cls, value: str | None) -> str | None:
        for server in value.split(",") if value else []:
            host, _, port = server.strip().rpartition(":")
            if not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    f"bootstrap servers {value!r}: expected host:port[,host:port...] "
                    f"(e.g. localhost:9092); {server.strip()!r} is not host:port"
                )
        return value

    @model_validator(mode="after")
    def _sasl_complete(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL") and not (
            self.sasl_mechanism and self.sasl_username and self.sasl_password
        ):
            raise ValueError(
                f"KAFKA_SECURITY_PROTOCOL={self.security_protocol} needs KAFKA_SASL_MECHANISM, "
                "KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
            )
        return self


class ScoringSettings(EnvThenFile):
    """The scoring worker: judge backend, voting, pairing timeouts, worker identity."""

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_SCORING_", frozen=True, extra="forbid")

    judge: Literal["rules", "sglang", "openai"] = Field(
        "rules", description="rules = deterministic heuristic judge (offline default)"
    )
    judge_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="one base URL per replica (comma-separated in env)"
    )
    judge_model: str | None = Field(None, description="model name sent to an OpenAI endpoint")
    judge_api_key: SecretStr | None = None
    judge_tokenizer: Path | None = Field(
        None, description="local HF tokenizer whose chat template renders SGLang prompts"
    )
    judge_timeout_s: float = Field(300.0, gt=0, description="per request")
    judge_max_attempts: int = Field(4, ge=1, description="per request, with backoff")
    judge_backoff_max_s: float = Field(
        8.0, ge=0, description="longest wait between tries of a request (random, from 0.5 s up)"
    )
    judge_concurrency: int = Field(64, ge=1, description="HTTP requests in flight per worker")
    judge_max_new_tokens: int = Field(
        4096, ge=1, description="the most tokens one vote may generate (hint votes: twice this)"
    )
    judge_temperature: float = Field(0.6, ge=0, description="sampling temperature of a vote")
    judge_constrained: Literal["auto", "on", "off"] = Field(
        "auto",
        description="SGLang judge: send a regex (SGLang's sampling_params.regex) that allows a "
        "short reason and then requires the score box, so every vote ends in a valid box "
        "within tens of tokens. auto = on when the judge server says it serves a judge "
        "trained by `turnstream judge train` (its /get_model_info), off otherwise",
    )
    judge_reason_chars: int = Field(
        200, ge=0, le=2000, description="constrained votes: the most characters before the box"
    )
    judge_batch_max: int = Field(
        32,
        ge=1,
        description="SGLang judge: pairs asked together in one /generate request (those "
        "waiting at the same moment; 1 = a request per pair)",
    )
    judge_batch_wait_ms: float = Field(
        5.0,
        ge=0,
        description="SGLang judge: how long a /generate request waits, from its first pair, "
        "for more pairs to ask with it (0 = only those asked in the same loop turn)",
    )
    mode: Literal["rl", "opd", "combine"] = "rl"
    policy_tokenizer: Path | None = Field(
        None,
        description="local tokenizer of the policy, for OPD teacher prompts (opd and combine "
        "with an SGLang judge)",
    )
    teacher_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="OPD teacher: SGLang /generate base URLs, one per replica (comma-separated "
        "in env), asked for the log-probs of each response under its hinted prompt; unset = "
        "the judge's URLs (the PRM serves them, as OpenClaw-RL does). With them opd and "
        "combine work with any judge, the rules judge included",
    )
    teacher_top_k: int = Field(0, ge=0, description="top-K teacher log-probs (0 = off)")
    teacher_contrast: bool = Field(
        False,
        description="also ask the teacher with a neutral line in the hint's place; the "
        "trainer then takes hinted - neutral as the OPD advantage instead of hinted - old, "
        "so what any appended text does to a small teacher's log-probs cancels out",
    )
    vote_mode: Literal["fixed", "early_stop"] = "fixed"
    m: int = Field(3, ge=1, description="eval votes per turn")
    hint_m: int = Field(1, ge=1, description="hint votes per turn (opd, combine)")
    window: int = Field(256, ge=1, description="pairs being judged at once per worker")
    idle_timeout_s: float = Field(1800.0, gt=0, description="flush a silent session's turn")
    idle_check_interval_s: float = Field(30.0, gt=0)
    group_id: str = Field("turnstream-scoring", description="consumer group of the workers")
    session_timeout_s: float = Field(
        10.0,
        ge=6.0,
        description="a worker that stops heartbeating (killed) loses its partitions after this",
    )
    commit_interval_s: float = Field(
        0.1, gt=0, description="how often a worker commits the inputs it has acknowledged"
    )
    linger_ms: float = Field(
        1.0,
        ge=0,
        description="how long a worker's producer waits to batch outputs (each hop of a pair "
        "waits this long at most; under load, requests fill up anyway)",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop",
        description="the worker's event loop: uvloop (faust-streaming's uvloop extra) spends "
        "less CPU a record than asyncio's own",
    )
    consumer_thread: bool = Field(
        False,
        description="run Faust's Kafka consumer in a thread of its own, as Faust does, rather "
        "than on the worker's event loop: a few ms more a hop, but the group heartbeat goes "
        "on while a synchronous reward processor holds the loop",
    )
    rewards: Path | None = Field(
        None,
        description="YAML of reward processors (pipeline.rewards) to score pairs with, in rl "
        "mode; unset: the PRM judge alone",
    )
    web_host: str = Field(
        "127.0.0.1",
        description="listen address of /metrics (0.0.0.0 for every interface, to be scraped "
        "from another container or pod)",
    )
    web_port: int = Field(6066, ge=0, le=65535, description="Prometheus /metrics; 0 = off")
    data_dir: Path = Field(Path(".turnstream/worker"), description="this worker's local state")

    @field_validator("judge_urls", "teacher_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [u.strip() for u in value.split(",") if u.strip()]
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ScoringSettings:
        """Rules across settings, checked once here for every process that scores."""
        if self.judge != "rules" and not self.judge_urls:
            raise ValueError(
                f"judge {self.judge!r} needs at least one URL: set TURNSTREAM_SCORING_JUDGE_URLS "
                "(--judge-url)"
            )
        if self.vote_mode == "early_stop" and self.m != 3:
            raise ValueError(f"vote_mode early_stop is defined for m=3, got m={self.m} (--m)")
        if self.mode != "rl":
            self._teacher_reachable()
        if self.rewards is not None and self.mode != "rl":
            raise ValueError(
                f"TURNSTREAM_SCORING_REWARDS={self.rewards}: reward processors score in rl "
                f"mode only (mode is {self.mode})"
            )
        return self

    def _teacher_reachable(self) -> None:
        """opd and combine need teacher log-probs: from the teacher URLs with any judge, or
        from an SGLang judge's own server; the rules judge without teacher URLs hints only."""
        if not self.teacher_urls and self.judge == "rules":
            return
        if not self.teacher_urls and self.judge != "sglang":
            raise ValueError(
                f"mode {self.mode} needs teacher log-probs from SGLang /generate: set "
                "TURNSTREAM_SCORING_TEACHER_URLS (--teacher-url) to a teacher server, or use "
                "judge sglang (--judge sglang), whose server then serves them"
            )
        if self.policy_tokenizer is None:
            raise ValueError(
                f"mode {self.mode} needs TURNSTREAM_SCORING_POLICY_TOKENIZER (a local "
                "tokenizer directory of the policy) to build the teacher prompt"
            )


class ProxySettings(EnvThenFile):
    """The capture proxy: where it listens, what it fronts, how it buffers turns."""

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_PROXY_", frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="listen address (0.0.0.0 for every interface)")
    port: int = Field(30000, ge=0, le=65535, description="listen port")
    upstream: str | None = Field(
        None, description="base URL of the policy server (SGLang or any OpenAI-compatible one)"
    )
    upstream_api_key: SecretStr | None = Field(None, description="bearer token for the upstream")
    api_key: SecretStr | None = Field(
        None, description="clients must send 'Authorization: Bearer <key>' (unset = no auth)"
    )
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="larger requests are refused with 413"
    )
    upstream_timeout_s: float = Field(600.0, gt=0, description="per upstream request")
    default_turn_type: Literal["main", "side"] = Field(
        "side", description="turn type of a request without X-Turn-Type (side turns never train)"
    )
    logprobs: bool = Field(True, description="ask the upstream for per-token log-probs")
    token_ids: bool = Field(
        False, description="ask the upstream for token ids (return_token_ids, where supported)"
    )
    buffer: int = Field(
        10000, ge=1, description="events waiting for Kafka; beyond it they are spooled to disk"
    )
    send_attempts: int = Field(3, ge=1, description="Kafka deliveries tried before spooling")
    reconnect_max_s: float = Field(
        30.0, ge=0, description="longest wait between tries to reach Kafka or resend (from 1 s)"
    )
    versions_retry_max_s: float = Field(
        60.0, ge=0, description="longest wait before following policy.versions again (from 1 s)"
    )
    policy_version: int | None = Field(
        None, ge=0, description="fixed policy version to stamp (default: follow policy.versions)"
    )
    data_dir: Path = Field(
        Path(".turnstream/proxy"), description="turn counters per session and the spool"
    )

    @field_validator("upstream")
    @classmethod
    def _base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.rstrip("/")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"upstream {value!r} must start with http:// or https://")
        return value.removesuffix("/v1")


class ConsoleSettings(EnvThenFile):
    """`turnstream console`: where the page listens, who may review, how much it holds."""

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_CONSOLE_", frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="listen address (0.0.0.0 for every interface)")
    port: int = Field(8080, ge=0, le=65535, description="listen port")
    token: SecretStr | None = Field(
        None,
        description="a review must send it (form field or 'Authorization: Bearer'); unset: "
        "the proxy's api_key, if that is set",
    )
    max_samples: int = Field(
        2000, ge=1, description="the most recent samples held (besides each version's extremes)"
    )
    per_version: int = Field(
        50, ge=1, le=1000, description="the highest and the lowest scored samples kept per version"
    )
    max_versions: int = Field(
        200, ge=1, description="versions whose samples are kept (older ones keep figures only)"
    )


class Settings(EnvThenFile):
    """Everything one turnstream process reads from its environment.

    Its fields of a settings class of their own (kafka, scoring, ...) are the sections of the
    YAML file, each read by that class.
    """

    model_config = SettingsConfigDict(env_prefix="TURNSTREAM_", frozen=True, extra="forbid")

    topics_file: Path = Field(default_factory=lambda: shipped_file("topics.yaml", "topics.yaml"))
    topic_prefix: str = Field("", description="prepended to every topic name (namespaces, tests)")
    topics_profile: str | None = Field(None, description="a profile of topics.yaml, e.g. cluster")
    client_id: str = "turnstream"
    producer_compression: Literal["gzip", "none", "lz4", "snappy", "zstd"] = "gzip"
    producer_gzip_level: int = Field(
        6, ge=1, le=9, description="zlib level of gzip batches (6: zlib's and librdkafka's default)"
    )
    producer_linger_ms: int = Field(5, ge=0)
    kafka: KafkaSettings = Field(default_factory=lambda: KafkaSettings())
    local_kafka: LocalKafkaSettings = Field(default_factory=lambda: LocalKafkaSettings())
    scoring: ScoringSettings = Field(default_factory=lambda: ScoringSettings())
    proxy: ProxySettings = Field(default_factory=lambda: ProxySettings())
    console: ConsoleSettings = Field(default_factory=lambda: ConsoleSettings())
    models: ModelSettings = Field(default_factory=lambda: ModelSettings())
    serve: ServeSettings = Field(default_factory=lambda: ServeSettings())

    @field_validator("topics_profile")
    @classmethod
    def _no_empty_profile(cls, value: str | None) -> str | None:
        return value or None  # TURNSTREAM_TOPICS_PROFILE= (empty) means no profile

    @property
    def uses_local_broker(self) -> bool:
        return not self.kafka.bootstrap_servers

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka.bootstrap_servers or self.local_kafka.bootstrap

    @property
    def topics(self) -> Topics:
        return _load_topics_cached(
            self.topics_file, self.topic_prefix, self.topics_profile, _mtime(self.topics_file)
        )


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0  # load_topics reports the missing file


@lru_cache(maxsize=32)
def _load_topics_cached(path: Path, prefix: str, profile: str | None, _mtime_ns: int) -> Topics:
    return load_topics(path, prefix=prefix, profile=profile)


def load_settings(**overrides: Any) -> Settings:
    """Read the settings once; a problem becomes a ConfigError naming the variable or YAML key."""
    from pydantic import ValidationError

    settings_sources.warn_unknown_variables(Settings)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = settings_sources.validation_problems(exc, Settings, overrides, config_path())
        raise ConfigError(f"invalid settings: {problems}") from exc
    except SettingsError as exc:
        raise ConfigError(f"invalid settings: {exc}") from exc


def setting_variables() -> set[str]:
    """Every environment variable the settings classes read (a section's JSON one included)."""
    return settings_sources.variables_read_by(Settings)
