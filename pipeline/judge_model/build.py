"""Train a judge end to end, and build the default one into the models cache once.

:func:`train_judge` is `turnstream judge train`: gold items to examples, the
frozen states, DeepSpeed epochs on the top layers, the held-out agreement, and
a checkpoint directory with ``turnstream-judge.json`` (base, data sha256,
steps, agreement). :func:`ensure_judge` builds ``smollm2-135m-judge`` from the
shipped data into the cache the first time it is asked for, as a catalogued
model is fetched once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import TurnstreamError
from pipeline.judge.prompts import PROMPT_VERSION
from pipeline.judge_model.examples import JudgeExample, Kind, build_examples
from pipeline.judge_model.options import TuneOptions
from pipeline.judge_model.progress import Progress
from pipeline.judge_model.stack import Split
from pipeline.judge_model.tune import (
    KindData,
    decisions,
    prefix_lengths,
    prepare,
    train,
)
from pipeline.models.decoder import check_transformers
from pipeline.models.fetch import JUDGE_MANIFEST, JUDGE_NAME, read_judge_manifest
from pipeline.rewards.agreement import AgreementReport, agreement, load_gold, render
from pipeline.settings import ModelSettings, shipped_file

DEFAULT_JUDGE = JUDGE_NAME
DEFAULT_BASE = "smollm2-135m-instruct"
Log = Callable[[str], None]


def default_data() -> tuple[Path, Path]:
    """The shipped gold files the default judge is built from (train, held-out)."""
    return (
        shipped_file("examples/judge/train.jsonl", "judge-train.jsonl"),
        shipped_file("examples/judge/heldout.jsonl", "judge-heldout.jsonl"),
    )


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(base: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        str(base), local_files_only=True, attn_implementation="sdpa", dtype="float32"
    )
    return tokenizer, model.eval()


def _kinds(
    split: Split, examples: list[JudgeExample], prefix: dict[Kind, int], pad: int, log: Log
) -> dict[Kind, KindData]:
    progress = Progress("frozen layers", len(examples), log)
    out = {}
    for kind, length in prefix.items():
        chosen = [e for e in examples if e.kind == kind]
        if chosen:
            out[kind] = prepare(split, chosen, length, pad, progress)
    progress.done()
    return out


def measure(
    split: Split, data: dict[Kind, KindData], tokenizer: Any
) -> dict[Kind, AgreementReport]:
    """Agreement of each kind's forced choice with its labels."""
    reports = {}
    for kind, kd in data.items():
        predicted = decisions(split, kd, tokenizer)
        labels = [float(e.label) for e in kd.examples]
        reports[kind] = agreement(labels, [float(p) for p in predicted])
    return reports


def report_json(report: AgreementReport) -> dict[str, Any]:
    table = report.table
    return {
        "n": report.n,
        "rho": report.rho,
        "kappa": report.kappa,
        "labels": list(table.labels),
        "counts": [[table.count(g, p) for p in table.labels] for g in table.labels],
    }


def train_judge(
    gold: Path,
    heldout: Path | None,
    base: Path,
    output: Path,
    options: TuneOptions,
    log: Log,
    base_name: str = DEFAULT_BASE,
) -> dict[str, Any]:
    """Train a judge from ``gold``; measure it on ``heldout``; write it to ``output``."""
    import torch

    check_transformers("judge training")
    started = time.monotonic()
    torch.manual_seed(options.seed)
    items = load_gold(gold)
    held = load_gold(heldout) if heldout is not None else []
    tokenizer, model = _load(base)
    split = Split(model, options.top_layers)
    train_ex = build_examples(items, tokenizer)
    held_ex = build_examples(held, tokenizer)
    prefix = prefix_lengths(train_ex + held_ex)
    pad = int(tokenizer.pad_token_id or 0)
    log(f"{len(items)} gold items: {len(train_ex)} examples; held out: {len(held_ex)} examples")
    train_data = _kinds(split, train_ex, prefix, pad, log)
    held_data = _kinds(split, held_ex, prefix, pad, log) if held_ex else {}
    prepared_s = time.monotonic() - started
    losses = train(split, train_data, options, log)
    reports = measure(split, held_data, tokenizer) if held_data else {}
    for kind, rep in reports.items():
        log(f"held-out agreement, {kind} prompt (forced choice):\n{render(rep)}")
    manifest = {
        "judge": True,
        "base": base_name,
        "prompt_version": PROMPT_VERSION,
        "data": {str(p.name): sha256_of(p) for p in (gold, heldout) if p is not None},
        "examples": {k: len(v.examples) for k, v in train_data.items()},
        "steps": len(losses),
        "first_loss": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
        "final_loss": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4),
        "options": dataclasses.asdict(options),
        "heldout_agreement": {k: report_json(r) for k, r in reports.items()},
        "prepare_s": round(prepared_s, 1),
        "train_s": round(time.monotonic() - started, 1),
        "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _save(model, tokenizer, base, output, manifest, reports)
    return manifest


def _save(
    model: Any,
    tokenizer: Any,
    base: Path,
    output: Path,
    manifest: dict[str, Any],
    reports: dict[Kind, AgreementReport],
) -> None:
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output))
    tokenizer.save_pretrained(str(output))
    generation = base / "generation_config.json"
    if generation.exists():
        shutil.copy(generation, output / "generation_config.json")
    text = "\n\n".join(f"{kind} prompt:\n{render(r)}" for kind, r in reports.items())
    (output / "agreement.txt").write_text(text + "\n")
    (output / JUDGE_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def is_built(directory: Path, data: tuple[Path, Path]) -> bool:
    """The directory holds the default judge as today's data, prompts and options make it."""
    manifest = read_judge_manifest(directory)
    if manifest is None:
        return False
    want = {p.name: sha256_of(p) for p in data}
    return bool(
        manifest.get("data") == want
        and manifest.get("prompt_version") == PROMPT_VERSION
        and manifest.get("options") == dataclasses.asdict(TuneOptions())
    )


def ensure_judge(settings: ModelSettings | None = None, log: Log = lambda _l: None) -> Path:
    """The default judge's directory, trained once from the shipped data into the cache."""
    from pipeline.models.fetch import cached_dir, ensure_model, lock

    settings = settings or ModelSettings()
    target = cached_dir(DEFAULT_JUDGE, settings)
    data = default_data()
    if is_built(target, data):
        return target
    base = ensure_model(DEFAULT_BASE, settings, log)
    with lock(settings.cache_dir / f".{DEFAULT_JUDGE}.lock"):
        if is_built(target, data):
            return target
        log(f"{DEFAULT_JUDGE}: training from {data[0].name} (once; a few minutes on 2 cores)")
        with tempfile.TemporaryDirectory(prefix=f".{DEFAULT_JUDGE}-", dir=settings.cache_dir) as t:
            out = Path(t) / "judge"
            train_judge(data[0], data[1], base, out, TuneOptions(), log)
            if target.exists():
                shutil.rmtree(target)
            out.rename(target)
    if not is_built(target, data):
        raise TurnstreamError(f"{target}: the judge was trained but its manifest does not match")
    return target
