"""Assemble a trainer process: tokenizer, engine, step loop, signals."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.broker.reading import TopicRange
from pipeline.settings import Settings
from pipeline.training.checkpoint import TrainerState
from pipeline.training.config import TrainerConfig
from pipeline.training.signals import REQUESTS
from pipeline.training.trainer import Trainer

log = logging.getLogger(__name__)


def load_tokenizer(config: TrainerConfig) -> Any:
    """The policy tokenizer: tokenizer_path, else model_path, else a tiny local one."""
    from transformers import AutoTokenizer

    path = config.tokenizer_path or config.model_path
    if path is None:
        from pipeline.training.tiny_tokenizer import make_tiny_tokenizer

        tiny = Path(config.checkpoint_dir).parent / "tokenizer"
        if not (tiny / "tokenizer.json").exists():
            make_tiny_tokenizer(tiny)
        path = str(tiny)
        log.info("no model_path: training a tiny random policy with the tokenizer in %s", tiny)
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def run_trainer(
    settings: Settings,
    config: TrainerConfig,
    until_end: bool = False,
    ledger_log: Path | None = None,
    span: TopicRange | None = None,
) -> TrainerState:
    from pipeline.training.engine import PolicyEngine, close_distributed

    REQUESTS.install()  # again, for callers that did not install them early
    tokenizer = load_tokenizer(config)
    engine = PolicyEngine(config, vocab_size=len(tokenizer))
    trainer = Trainer(settings, config, engine, tokenizer, ledger_log=ledger_log, span=span)

    trainer.requests = REQUESTS
    state = trainer.run(until_end=until_end)
    close_distributed()  # only after a clean end: a failed rank must not wait for the rest
    return state
