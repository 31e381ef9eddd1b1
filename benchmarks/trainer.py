"""Trainer step throughput vs a plain PyTorch loop, and padding with/without bucketing.

Both sides run the same loss (``losses.policy_loss`` on rl advantages,
aggregated by the default ``loss_agg``) on the same tiny random model and the
same batch; the plain loop uses
torch.optim.AdamW with no DeepSpeed, their steps alternating (a shared machine's load
falls on both alike); each side's tokens/s is that of its fastest step.
Tokens/s counts response tokens trained.
Prints a table and writes benchmarks/results/trainer.json.

    python benchmarks/trainer.py [--device cpu|cuda] [--model tiny|0.5b] [--steps 5]

``--model 0.5b`` is a randomly initialised Qwen2-0.5B-shaped policy (bf16 on
cuda); MFU = 6 * parameters * tokens/s / the GPU's peak bf16 FLOP/s
(``--peak-tflops``, default 989 for an H100/H200 SXM dense bf16).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import subprocess
import time
from pathlib import Path

import torch

from pipeline.training import losses
from pipeline.training.batch import TokenizedSample, micro_batches, padding_fraction
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine, token_logprobs

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB = 512
MODELS = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
}


def workload(n: int, seed: int = 0) -> list[TokenizedSample]:
    """Prompts of 16-384 tokens and responses of 8-128, like short agent turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(16, 384))]
        response = [rng.randrange(VOCAB) for _ in range(rng.randint(8, 128))]
        out.append(
            TokenizedSample(f"b:{i}", prompt, response, rng.choice([1.0, -1.0]), None, None, 0)
        )
    return out


def plain_step(model: torch.nn.Module, opt: torch.optim.Optimizer, mbs: list, config) -> int:  # type: ignore[no-untyped-def,type-arg]
    agg = config.loss_agg
    units = sum(losses.agg_units(mb.response_mask, agg) for mb in mbs)
    with torch.no_grad():
        olds = [token_logprobs(model, mb)[0] for mb in mbs]
    opt.zero_grad()
    for mb, old in zip(mbs, olds, strict=True):
        logp, _ = token_logprobs(model, mb)
        adv = losses.rl_advantages(mb.rewards, mb.response_mask)
        stats = losses.policy_loss(
            logp,
            old,
            mb.rollout_logprobs,
            adv,
            mb.response_mask,
            eps=config.eps_clip,
            eps_high=config.eps_clip_high,
            tis_clip=config.tis_clip,
            agg=agg,
        )
        (stats.pg_loss * losses.agg_units(mb.response_mask, agg) / units).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    opt.step()
    return sum(mb.tokens for mb in mbs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    tiny = MODELS[args.model]
    config = TrainerConfig(
        mode="rl",
        lr=1e-4,
        micro_batch_size=args.micro_batch,
        zero_stage=1,
        tiny_model=tiny,
        bf16=args.device == "cuda",
        update_weights_interval=0,
        monitor_kl=False,  # the plain loop measures no KL: the same work on both sides
    )
    batch = workload(args.samples)
    bucketed = micro_batches(batch, args.micro_batch, pad_id=0, bucketing=True)
    plain_mbs = micro_batches(batch, args.micro_batch, pad_id=0, bucketing=False)
    engine = PolicyEngine(config, vocab_size=VOCAB if args.model == "tiny" else 151936)
    params = sum(p.numel() for p in engine.engine.module.parameters())
    model = copy.deepcopy(engine.engine.module)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=config.lr,
        betas=tuple(config.betas),
        weight_decay=config.weight_decay,
    )
    engine.train_step(bucketed)  # warm-up both
    plain_step(model, opt, bucketed, config)
    # Steps alternate between the two sides, so a change in the machine's load
    # (other processes on a shared machine) falls on both alike.
    # Each side's figure is its fastest step: the step's own cost, least disturbed by
    # whatever else the machine ran meanwhile (every step's time is in the JSON).
    ds_times: list[float] = []
    plain_times: list[float] = []
    tokens = sum(mb.tokens for mb in bucketed)
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.train_step(bucketed)
        ds_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        plain_step(model, opt, bucketed, config)
        plain_times.append(time.perf_counter() - start)
    ds_tps, plain_tps = tokens / min(ds_times), tokens / min(plain_times)
    result = {
        "device": args.device,
        "cores": os.cpu_count(),
        "samples": args.samples,
        "micro_batch": args.micro_batch,
        "steps": args.steps,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "model": tiny,
        "deepspeed_tokens_per_s": round(ds_tps, 1),
        "plain_torch_tokens_per_s": round(plain_tps, 1),
        "ratio_deepspeed_over_plain": round(ds_tps / plain_tps, 3),
        "step_seconds_deepspeed": [round(t, 4) for t in ds_times],
        "step_seconds_plain": [round(t, 4) for t in plain_times],
        "padding_fraction_bucketed": round(padding_fraction(bucketed), 4),
        "padding_fraction_unbucketed": round(padding_fraction(plain_mbs), 4),
        "parameters": params,
        "mfu_deepspeed": round(6 * params * ds_tps / (args.peak_tflops * 1e12), 4)
        if args.device == "cuda"
        else None,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"trainer-{args.device}-{args.model}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    if result["mfu_deepspeed"] is not None:
        print(f"MFU (DeepSpeed step): {result['mfu_deepspeed']}")
    print(f"\n{'trainer step':<28}{'tokens/s':>12}")
    print(f"{'DeepSpeed (PolicyEngine)':<28}{result['deepspeed_tokens_per_s']:>12}")
    print(f"{'plain PyTorch loop':<28}{result['plain_torch_tokens_per_s']:>12}")
    print(f"ratio: {result['ratio_deepspeed_over_plain']}")
    print(
        f"padding fraction: bucketed {result['padding_fraction_bucketed']}, "
        f"unbucketed {result['padding_fraction_unbucketed']}"
    )


if __name__ == "__main__":
    main()
