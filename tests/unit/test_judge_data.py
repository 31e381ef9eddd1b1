"""The shipped judge data is what examples/judge/make_data.py writes, and its train split
gives the judge no label through the assistant output alone."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from collections import defaultdict
from types import ModuleType

from tests.conftest import REPO

DATA = REPO / "examples" / "judge"


def make_data() -> ModuleType:
    spec = importlib.util.spec_from_file_location("judge_make_data", DATA / "make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_the_generator_writes_exactly_the_shipped_files() -> None:
    md = make_data()
    splits = {
        split: md.Maker(split, random.Random(md.SEED + index)).build(md.SIZES[split])
        for index, split in enumerate(md.SIZES)
    }
    md.check_splits(splits)
    for split, items in splits.items():
        written = "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items)
        assert written == (DATA / f"{split}.jsonl").read_text(), f"{split}.jsonl is stale"


def test_in_training_a_reply_not_the_output_tells_the_label() -> None:
    """Thanks, vague and unrelated replies follow wrong and long outputs too: an output
    seen with a correction is seen with other labels as well."""
    labels: dict[str, set[int]] = defaultdict(set)
    replies_after_any = 0
    rows = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()]
    for row in rows:
        if row["next_state"]["role"] == "user":
            labels[row["response"]["content"]].add(row["label"])
    for row in rows:
        category = row["request_metadata"]["category"]
        if category in ("user_confirm", "user_vague", "user_unrelated"):
            replies_after_any += -1 in labels[row["response"]["content"]]
    corrected = [out for out, seen in labels.items() if -1 in seen]
    mixed = [out for out in corrected if len(labels[out]) > 1]
    assert replies_after_any >= 40
    assert len(mixed) >= len(corrected) // 2
