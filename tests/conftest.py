"""Test tiers: unit tests need nothing; `kafka` tests share one real broker."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.broker.local import free_port_pair
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings

__all__ = ["REPO", "free_port_pair"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real Kafka broker for the whole test session (or KAFKA_BOOTSTRAP_SERVERS).

    If the broker cannot start, every `kafka` test errors with the broker's log:
    the tier is never skipped.
    """
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield external
        return
    from pipeline.broker.local import LocalKafka

    local = LocalKafka(
        LocalKafkaSettings(port=free_port_pair(), data_dir=tmp_path_factory.mktemp("kafka")),
        log=lambda _msg: None,
    )
    local.start()
    try:
        yield local.settings.bootstrap
    finally:
        local.stop()


@pytest.fixture
def topic_prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


@pytest.fixture
def settings(kafka_bootstrap: str, topic_prefix: str) -> Settings:
    """Settings pointing at the session broker, with topic names unique to this test."""
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        topic_prefix=topic_prefix,
        producer_linger_ms=0,
    )


@pytest.fixture
def cli_env(kafka_bootstrap: str, topic_prefix: str) -> dict[str, str]:
    """Environment for running the `turnstream` CLI against the session broker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, TURNSTREAM_TOPIC_PREFIX=topic_prefix)
    return env


@contextmanager
def raw_records_undone() -> Iterator[None]:
    """Inside, :func:`pipeline.broker.raw_records.install` may patch aiokafka; on the way out
    aiokafka has its own fetcher class again (unless it was installed before)."""
    from pipeline.broker import raw_records

    if raw_records.installed():
        yield
        return
    try:
        yield
    finally:
        raw_records.uninstall()


@pytest.fixture(autouse=True)
def _raw_records_undone() -> Iterator[None]:
    """A test that reads raw records (directly or through a range reader) leaves aiokafka
    as it found it: the patch lasts a process in production, a test in the tests."""
    with raw_records_undone():
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/kafka/ is in the `kafka` tier, under tests/model/ in `model`,
    under tests/cluster/ in `cluster` (a three-broker cluster of its own: make test-cluster)."""
    for item in items:
        if "/tests/kafka/" in str(item.fspath):
            item.add_marker(pytest.mark.kafka)
        if "/tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
        if "/tests/model/" in str(item.fspath):
            item.add_marker(pytest.mark.model)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct checkpoint, fetched and converted once per machine
    (`make model` does it before the tests; here it happens on first use)."""
    from pipeline.models import ensure_model

    return ensure_model("smollm2-135m-instruct", log=print)


@pytest.fixture(scope="session")
def smollm2_judge(smollm2: Path) -> Path:
    """The default judge, trained once per machine from the shipped labelled next states
    (`make judge` does it before the tests; here it happens on first use)."""
    from pipeline.judge_model.build import ensure_judge

    return ensure_judge(log=print)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small local tokenizer with a chat template (nothing can be downloaded)."""
    from pipeline.training.tiny_tokenizer import make_tiny_tokenizer

    corpus = (REPO / "examples" / "sessions.jsonl").read_text().splitlines()[:60]
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"), corpus, vocab_size=400)


HEADER_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m.get('reasoning_content') %}<think>{{ m['reasoning_content'] }}</think>\n{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{% for c in m.get('tool_calls') or [] %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "{% endfor %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="session")
def header_tokenizer(tiny_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny tokenizer with another chat template: header tokens, an explicit
    end-of-turn token ``<|eot_id|>`` as eos, and reasoning_content in ``<think>``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer), local_files_only=True)
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.eos_token = "<|eot_id|>"
    tok.chat_template = HEADER_TEMPLATE
    out = tmp_path_factory.mktemp("header-tokenizer")
    tok.save_pretrained(str(out))
    return out
