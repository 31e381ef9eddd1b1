# One entry point for every check: the same targets run locally and in CI (.ci/run).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-unit test-kafka soak lint format bench kafka-jars clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

kafka-jars: setup
	$(BIN)/python -c "from pipeline.settings import load_settings; \
	from pipeline.broker.local import LocalKafka; \
	LocalKafka(load_settings().local_kafka).resolve_jars()"

demo: setup kafka-jars
	$(BIN)/turnstream demo

test: setup kafka-jars
	@command -v kcat >/dev/null || command -v kafkacat >/dev/null || \
		(echo "installing kcat (interop tests)"; apt-get update -qq && apt-get install -y -qq kcat)
	$(BIN)/pytest

test-unit: setup
	$(BIN)/pytest tests/unit

test-kafka: setup kafka-jars
	$(BIN)/pytest tests/kafka

soak: setup kafka-jars
	$(BIN)/pytest -m slow -o addopts=""

lint: setup
	$(BIN)/ruff format --check pipeline tests benchmarks examples
	$(BIN)/ruff check pipeline tests benchmarks examples
	$(BIN)/mypy pipeline

format: setup
	$(BIN)/ruff format pipeline tests benchmarks examples
	$(BIN)/ruff check --fix pipeline tests benchmarks examples

bench: setup kafka-jars
	$(BIN)/python benchmarks/produce.py
	$(BIN)/python benchmarks/votes.py
	$(BIN)/python benchmarks/trainer.py
	$(BIN)/python benchmarks/proxy.py
	$(BIN)/python benchmarks/replay.py
	$(BIN)/python benchmarks/saturation.py
	$(BIN)/python benchmarks/latency.py
	$(BIN)/python benchmarks/scaleout.py

clean:
	rm -rf $(VENV) .turnstream .pytest_cache .mypy_cache .ruff_cache
