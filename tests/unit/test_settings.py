from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

import pipeline.settings as settings_module
import pipeline.settings_sources as settings_sources
from pipeline.broker.clients import kafka_python_config
from pipeline.errors import ConfigError
from pipeline.settings import load_settings
from tests.conftest import REPO


def test_local_broker_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("TURNSTREAM_KAFKA_PORT", "19500")
    settings = load_settings()
    assert settings.uses_local_broker
    assert settings.bootstrap_servers == "127.0.0.1:19500"
    assert settings.local_kafka.controller == 19501


def test_cluster_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    settings = load_settings()
    assert not settings.uses_local_broker
    assert kafka_python_config(settings)["bootstrap_servers"] == ["k1:9092", "k2:9092"]


def test_security_settings_flow_to_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9093")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "trainer")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret-pw")
    monkeypatch.setenv("KAFKA_SSL_CAFILE", "/etc/kafka/ca.pem")
    settings = load_settings()
    config = kafka_python_config(settings)
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert config["sasl_plain_username"] == "trainer"
    assert config["sasl_plain_password"] == "s3cret-pw"
    assert config["ssl_cafile"] == "/etc/kafka/ca.pem"
    assert "s3cret-pw" not in repr(settings) and "s3cret-pw" not in str(settings.model_dump())
    assert "s3cret-pw" not in repr(config)  # kafka-python logs its config at debug level


def test_incomplete_sasl_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.delenv("KAFKA_SASL_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="needs KAFKA_SASL_MECHANISM"):
        load_settings()


def test_worker_metrics_host_defaults_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTREAM_SCORING_WEB_HOST", raising=False)
    assert load_settings().scoring.web_host == "127.0.0.1"
    monkeypatch.setenv("TURNSTREAM_SCORING_WEB_HOST", "0.0.0.0")
    assert load_settings().scoring.web_host == "0.0.0.0"


def test_yaml_settings_file_is_lowest_priority(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "turnstream.yaml"
    path.write_text("topic_prefix: from-yaml.\nclient_id: yaml-client\n")
    monkeypatch.setenv("TURNSTREAM_CONFIG", str(path))
    monkeypatch.setenv("TURNSTREAM_CLIENT_ID", "env-client")
    settings = load_settings()
    assert settings.topic_prefix == "from-yaml."
    assert settings.client_id == "env-client"
    assert settings.topics.chat_turns.name == "from-yaml.chat.turns"


def test_topics_profile_setting_picks_the_values_of_topics_yaml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.scoring.faust_app import faust_app

    monkeypatch.delenv("TURNSTREAM_TOPICS_FILE", raising=False)
    monkeypatch.delenv("TURNSTREAM_TOPICS_PROFILE", raising=False)
    plain = load_settings()
    assert (plain.topics_profile, plain.topics.profile) == (None, None)
    assert plain.topics.chat_turns.replication_factor == 1
    monkeypatch.setenv("TURNSTREAM_TOPICS_PROFILE", "cluster")
    cluster = load_settings()
    assert cluster.topics.profile == "cluster"
    assert cluster.topics.chat_turns.replication_factor == 3
    assert plain.topics.chat_turns.replication_factor == 1  # one cache entry per profile
    # the workers' changelog topic is replicated as chat.turns
    assert faust_app(cluster).conf.topic_replication_factor == 3
    monkeypatch.setenv("TURNSTREAM_TOPICS_PROFILE", "")
    assert load_settings().topics.profile is None
    monkeypatch.setenv("TURNSTREAM_TOPICS_PROFILE", "nope")
    with pytest.raises(ConfigError, match="no profile 'nope'; the profiles it declares: cluster"):
        load_settings().topics  # noqa: B018


def test_security_settings_flow_to_the_faust_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    import faust

    from pipeline.broker.clients import faust_credentials

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "k1:9093")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "worker")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "pw-123")
    creds = faust_credentials(load_settings())
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password) == ("worker", "pw-123")
    assert creds.mechanism.value == "SCRAM-SHA-512"
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    assert faust_credentials(load_settings()) is None


def test_flush_or_raise_reports_undelivered_records() -> None:
    from pipeline.broker.clients import flush_or_raise
    from pipeline.errors import BrokerError

    class Future:
        def __init__(self, exc: Exception | None) -> None:
            self.exception = exc

        def failed(self) -> bool:
            return self.exception is not None

    class Producer:
        flushed = 0

        def flush(self) -> None:
            self.flushed += 1

    prod = Producer()
    ok = [Future(None), Future(None)]
    flush_or_raise(prod, ok, "records")  # type: ignore[arg-type]
    assert prod.flushed == 1 and ok == []
    with pytest.raises(BrokerError, match="1 dead letters could not be delivered"):
        flush_or_raise(prod, [Future(None), Future(TimeoutError("t"))], "dead letters")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"TURNSTREAM_SCORING_JUDGE": "sglang"}, "needs at least one URL"),
        ({"TURNSTREAM_SCORING_VOTE_MODE": "early_stop", "TURNSTREAM_SCORING_M": "5"}, "m=3"),
        (
            {"TURNSTREAM_SCORING_JUDGE": "openai", "TURNSTREAM_SCORING_JUDGE_URLS": "http://j:1",
             "TURNSTREAM_SCORING_MODE": "combine"},
            "needs teacher log-probs from SGLang",
        ),
        (
            {"TURNSTREAM_SCORING_JUDGE": "sglang", "TURNSTREAM_SCORING_JUDGE_URLS": "http://j:1",
             "TURNSTREAM_SCORING_MODE": "opd"},
            "TURNSTREAM_SCORING_POLICY_TOKENIZER",
        ),
        (
            {"TURNSTREAM_SCORING_REWARDS": "r.yaml", "TURNSTREAM_SCORING_MODE": "opd"},
            "rl mode only",
        ),
    ],
)  # fmt: skip
def test_scoring_rules_across_settings_are_checked_when_settings_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], problem: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=problem):
        load_settings()


def test_a_consistent_scoring_setup_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTREAM_SCORING_JUDGE", "sglang")
    monkeypatch.setenv("TURNSTREAM_SCORING_JUDGE_URLS", "http://j:1,http://j:2")
    monkeypatch.setenv("TURNSTREAM_SCORING_VOTE_MODE", "early_stop")
    scoring = load_settings().scoring
    assert scoring.judge_urls == ["http://j:1", "http://j:2"] and scoring.m == 3


def test_a_malformed_bootstrap_string_says_what_is_expected() -> None:
    from pipeline.produce import TurnProducer

    for bad in ("localhost", "http://broker:9092", "broker:port", "a:9092,b"):
        with pytest.raises(ConfigError, match=r"expected host:port\[,host:port\.\.\.\]"):
            TurnProducer.connect(bad)
    with pytest.raises(ConfigError, match=r"bootstrap servers .nohost.: expected host:port"):
        load_settings(kafka={"bootstrap_servers": "nohost"})


def test_an_invalid_setting_is_named_by_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TURNSTREAM_SCORING_M", "0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        "invalid settings: TURNSTREAM_SCORING_M: Input should be greater than or equal to 1"
    )
    monkeypatch.delenv("TURNSTREAM_SCORING_M")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "localhost:90x2")
    with pytest.raises(ConfigError, match=r"^invalid settings: KAFKA_BOOTSTRAP_SERVERS: .* "
                       r"'localhost:90x2' is not host:port$"):  # fmt: skip
        load_settings()


def config_file(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> Path:
    """A YAML settings file, named by TURNSTREAM_CONFIG."""
    path.write_text(text)
    monkeypatch.setenv("TURNSTREAM_CONFIG", str(path))
    return path


@pytest.mark.parametrize(
    ("yaml_text", "key", "meant", "siblings"),
    [
        ("scoring: {windw: 3}\n", "scoring.windw", "scoring.window", "(scoring has: "),
        ("topic_prefx: x\n", "topic_prefx", "topic_prefix", "(the top level has: "),
        ("proxy:\n  port: 1\n  uptream: http://u:1\n", "proxy.uptream", "proxy.upstream", None),
        ("serve: {prot: 31000}\n", "serve.prot", "serve.port", "(serve has: "),
    ],
)
def test_a_misspelt_yaml_key_names_itself_its_file_and_the_setting_meant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, yaml_text: str, key: str, meant: str,
    siblings: str | None,
) -> None:  # fmt: skip
    path = config_file(monkeypatch, tmp_path / "config.yaml", yaml_text)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert f"{key} in {path} is not a setting; did you mean {meant}" in message
    assert siblings is None or siblings in message


def test_yaml_sections_reach_their_settings_and_the_environment_beats_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config_file(
        monkeypatch,
        tmp_path / "config.yaml",
        "topic_prefix: from-yaml.\nclient_id: yaml-client\n"
        "scoring:\n  m: 5\n  window: 7\nproxy: {port: 30005}\nlocal_kafka: {port: 19600}\n"
        "serve: {port: 30007}\nmodels: {download_timeout_s: 5}\n",
    )
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    for name in ("TURNSTREAM_SCORING_M", "TURNSTREAM_PROXY_PORT", "TURNSTREAM_KAFKA_PORT",
                 "TURNSTREAM_SERVE_PORT", "TURNSTREAM_MODELS_DOWNLOAD_TIMEOUT_S"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TURNSTREAM_SCORING_WINDOW", "99")
    monkeypatch.setenv("TURNSTREAM_CLIENT_ID", "env-client")
    settings = load_settings()
    assert (settings.scoring.m, settings.scoring.window) == (5, 99)
    assert (settings.topic_prefix, settings.client_id) == ("from-yaml.", "env-client")
    assert (settings.proxy.port, settings.bootstrap_servers) == (30005, "127.0.0.1:19600")
    assert (settings.serve.port, settings.models.download_timeout_s) == (30007, 5.0)


def test_a_section_class_no_settings_class_holds_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Stray(settings_sources.EnvThenFile):  # a section that Settings has no field for
        port: int = 1

    path = config_file(monkeypatch, tmp_path / "config.yaml", "client_id: c\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: Stray is no section of it")):
        Stray()
    assert settings_sources.section_of(settings_module.ServeSettings) == "serve"
    assert settings_sources.section_of(settings_module.Settings) is None


def test_a_bad_yaml_value_is_named_by_its_key_and_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = config_file(monkeypatch, tmp_path / "config.yaml", "scoring: {m: 0}\n")
    monkeypatch.delenv("TURNSTREAM_SCORING_M", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        f"invalid settings: scoring.m in {path}: Input should be greater than or equal to 1"
    )


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("- a\n", "expected a mapping at the top level"),
        ("scoring: [1]\n", "scoring must be a mapping of setting: value"),
        ("a: [\n", "cannot read settings: while parsing"),
    ],
)
def test_an_unusable_settings_file_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, yaml_text: str, message: str
) -> None:
    path = config_file(monkeypatch, tmp_path / "config.yaml", yaml_text)
    with pytest.raises(ConfigError, match=re.escape(f"TURNSTREAM_CONFIG={path}: {message}")):
        load_settings()


def test_a_missing_settings_file_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNSTREAM_CONFIG", "/nonexistent/turnstream.yaml")
    with pytest.raises(ConfigError, match=r"TURNSTREAM_CONFIG=/nonexistent/turnstream\.yaml: "
                       r"cannot read settings: no such file"):  # fmt: skip
        load_settings()


def test_an_unknown_argument_is_named_with_the_setting_meant() -> None:
    with pytest.raises(ConfigError, match=r"scoring\.windw in the arguments of load_settings is "
                       r"not a setting; did you mean scoring\.window\?"):  # fmt: skip
        load_settings(scoring={"windw": 3})


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable warned about yet in this process, and none of the caller's set."""
    monkeypatch.setattr(settings_sources, "_warned", set())
    for name in os.environ:
        if name.upper().startswith("TURNSTREAM_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("warned")
def test_an_unknown_turnstream_variable_warns_once_and_the_process_loads(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TURNSTREAM_SCORING_WINDW", "3")
    with caplog.at_level(logging.WARNING, logger="pipeline.settings"):
        assert load_settings().scoring.window == 256
        load_settings()
    [record] = caplog.records
    assert record.getMessage() == (
        "TURNSTREAM_SCORING_WINDW is set but is not a setting, so it is ignored; "
        "did you mean TURNSTREAM_SCORING_WINDOW?"
    )


@pytest.mark.usefixtures("warned")
def test_settings_and_variables_read_directly_do_not_warn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    config_file(monkeypatch, tmp_path / "config.yaml", "client_id: c\n")
    for name in ("TURNSTREAM_SOAK_TURNS", "TURNSTREAM_TEST_HOLD", "TURNSTREAM_SCORING_WINDOW"):
        monkeypatch.setenv(name, "5")
    monkeypatch.setenv("TURNSTREAM_SCORING", "{}")  # the section as JSON, read by pydantic
    with caplog.at_level(logging.WARNING, logger="pipeline.settings"):
        assert load_settings().client_id == "c"
    assert caplog.records == []


def test_every_turnstream_variable_read_directly_is_known_to_the_settings() -> None:
    read = re.compile(r"os\.(?:environ\.get\(|environ\[|getenv\()\s*[\"'](TURNSTREAM_\w+)[\"']")
    found = {
        name
        for folder in ("pipeline", "tests", "benchmarks", "examples")
        for path in (REPO / folder).rglob("*.py")
        for name in read.findall(path.read_text())
    }
    assert found == set(settings_module.READ_DIRECTLY)
    assert not found & settings_module.setting_variables()
