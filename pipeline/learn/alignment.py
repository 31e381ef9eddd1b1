"""Log-prob alignment: the serving engine's log-probs against the trainer's, same weights.

The server reports a log-prob for every token it sampled; the trainer
recomputes them from the ids it trains on (its own tokenisation and model
code). At the same weights they must agree to float32 rounding: a gap means
the trainer trains on other tokens than were generated (retokenisation
drift) or computes another distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.broker.reading import read_to_end
from pipeline.events import Sample, decode_as
from pipeline.settings import Settings

MEAN_BOUND = 1e-4
MAX_BOUND = 1e-3


def summarize(diffs: Sequence[float], samples: int) -> dict[str, Any]:
    """Mean and max of per-token |server - trainer| and whether both are within bounds."""
    if not diffs:
        return {"samples": samples, "tokens": 0, "mean_abs_diff": None, "max_abs_diff": None,
                "within_bounds": False}  # fmt: skip
    mean, top = sum(diffs) / len(diffs), max(diffs)
    return {
        "samples": samples,
        "tokens": len(diffs),
        "mean_abs_diff": mean,
        "max_abs_diff": top,
        "bounds": {"mean": MEAN_BOUND, "max": MAX_BOUND},
        "within_bounds": mean <= MEAN_BOUND and top <= MAX_BOUND,
    }


def read_samples(settings: Settings, version: int, limit: int) -> list[Sample]:
    """Up to ``limit`` samples from samples.scored served by ``version`` with log-probs."""
    found: list[Sample] = []
    for record in read_to_end(settings, settings.topics.samples_scored.name):
        sample = decode_as(Sample, record.value)
        if sample.policy_version == version and sample.response_logprobs:
            found.append(sample)
            if len(found) == limit:
                break
    return found


def measure(samples: Sequence[Sample], model_dir: Path) -> dict[str, Any]:
    """Recompute the samples' response log-probs with the trainer's code at ``model_dir``."""
    import torch
    from transformers import AutoTokenizer

    from pipeline.training.batch import collate, tokenize_sample
    from pipeline.training.config import TrainerConfig
    from pipeline.training.engine import build_model, token_logprobs

    config = TrainerConfig(model_path=str(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = build_model(config, len(tokenizer)).eval()
    pad = tokenizer.pad_token_id or 0
    diffs: list[float] = []
    for sample in samples:
        tokenized = tokenize_sample(sample, tokenizer, config.max_seq_len)
        batch = collate([tokenized], pad)
        with torch.no_grad():
            trainer, _ = token_logprobs(model, batch)
        known = batch.response_mask.bool() & torch.isfinite(batch.rollout_logprobs)
        gap = (trainer - batch.rollout_logprobs.nan_to_num())[known].abs()
        diffs += [float(d) for d in gap.tolist() if math.isfinite(d)]
    return summarize(diffs, len(samples))
