"""What measuring the KL to the initial policy costs a trainer step that trains its top layers.

Three engines on the same tiny random policy (8 decoder layers, the top 2 trained) and the
same batch: no reference (``monitor_kl: false``), the top-layer reference (frozen copies of
the top 2 layers and the final norm, run on the policy's own hidden state) and a full copy
of the model (what a policy that trains every weight needs). Their steps alternate, so a
shared machine's load falls on all alike; each one's figure is its fastest step. Prints a
table and writes benchmarks/results/kl_reference.json.

    python benchmarks/kl_reference.py [--steps 5] [--layers 8] [--top 2]
"""

from __future__ import annotations

import argparse
import os
import time

from common import write_result
from trainer import VOCAB, workload

from pipeline.training.batch import micro_batches
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine, build_model
from pipeline.training.reference import FullReference


def engines(config: TrainerConfig) -> dict[str, PolicyEngine]:
    """name -> engine: no reference, the top-layer one, a full copy (same initial weights)."""
    off = PolicyEngine(TrainerConfig(**{**vars(config), "monitor_kl": False}), vocab_size=VOCAB)
    top = PolicyEngine(config, vocab_size=VOCAB)
    full = PolicyEngine(config, vocab_size=VOCAB)
    full.reference = FullReference(build_model(config, VOCAB), full.device)
    return {"no reference": off, "top-layer reference": top, "full-copy reference": full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--top", type=int, default=2)
    args = parser.parse_args()
    model = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": args.layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    config = TrainerConfig(
        lr=1e-4,
        micro_batch_size=args.micro_batch,
        tiny_model=model,
        train_top_layers=args.top,
        update_weights_interval=0,
    )
    batch = micro_batches(workload(args.samples), args.micro_batch, pad_id=0)
    sides = engines(config)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for eng in sides.values():
        eng.train_step(batch)  # warm-up
    for _ in range(args.steps):
        for name, eng in sides.items():
            start = time.perf_counter()
            eng.train_step(batch)
            times[name].append(time.perf_counter() - start)
    base = min(times["no reference"])
    result = {
        "load_average_1m": round(os.getloadavg()[0], 2),
        "model": model,
        "train_top_layers": args.top,
        "samples": args.samples,
        "tokens": sum(mb.tokens for mb in batch),
        "fastest_step_s": {name: round(min(t), 4) for name, t in times.items()},
        "over_no_reference": {name: round(min(t) / base, 3) for name, t in times.items()},
        "step_seconds": {name: [round(x, 4) for x in t] for name, t in times.items()},
    }
    write_result("kl_reference", result)
    print(f"\n{'trainer step, top ' + str(args.top) + ' of ' + str(args.layers):<28}"
          f"{'fastest s':>12}{'x no ref':>10}")  # fmt: skip
    for name in sides:
        print(f"{name:<28}{result['fastest_step_s'][name]:>12}"
              f"{result['over_no_reference'][name]:>10}")  # fmt: skip


if __name__ == "__main__":
    main()
