"""Weight pushes under load: the embedded server keeps answering while its weights change.

Serves SmolLM2-135M-Instruct (`turnstream serve`, CPU) and pushes weights to it
10 times (``/update_weights_from_disk``, alternately a perturbed copy and the
original, each push naming its version) while client threads send chat and
/generate requests without pause. Reports the requests served during pushes,
failures (there must be none), p50/p99 latency of requests that overlapped a
push vs those that did not, how long each push took, and that every answer
named the version it was served by. Prints a table and writes
benchmarks/results/serve_push.json.

    python benchmarks/serve_push.py [--pushes 10] [--clients 4] [--gap 6]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from common import REPO, pct, spawn, stop, wait_http, write_result

from pipeline.broker.local import free_port_pair
from pipeline.models import ensure_model

PROMPTS = ["Briefly, what is a comet?", "Name three colours.", "What is 12 times 3?",
           "Briefly, why is the sky blue?", "Give me a short greeting."]  # fmt: skip


def perturbed_copy(model_dir: Path, out: Path, scale: float = 0.02) -> Path:
    """The model with Gaussian noise (``scale`` x each tensor's std) added: a "trained" copy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * p.std() * scale)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(out))
    return out


def post(url: str, body: dict, timeout: float = 300.0) -> tuple[int, dict, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return (
                response.status,
                json.loads(response.read()),
                response.headers.get("X-Weight-Version", ""),
            )
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read()[:300].decode(errors="replace")}, ""


def client(base: str, index: int, stop_at: list[float], log: list[dict]) -> None:
    """Requests one after another until told to stop: chat and /generate in turn."""
    n = 0
    while time.monotonic() < stop_at[0]:
        prompt = PROMPTS[(index + n) % len(PROMPTS)]
        if n % 2:
            path, body = "/generate", {"text": prompt, "sampling_params":
                                       {"temperature": 0.7, "max_new_tokens": 32}}  # fmt: skip
        else:
            path, body = "/v1/chat/completions", {"model": "default", "max_tokens": 32,
                "temperature": 0.7, "logprobs": True,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        start = time.monotonic()
        try:
            status, answer, version = post(base + path, body)
        except OSError as exc:
            status, answer, version = 0, {"error": repr(exc)}, ""
        log.append({"start": start, "end": time.monotonic(), "status": status,
                    "version": version, "path": path,
                    "error": None if status == 200 else answer.get("error")})  # fmt: skip
        n += 1


def sampler(base: str, stop_at: list[float], samples: list[dict]) -> None:
    """The engine's state each second: loop time, rows running, and the machine's load."""
    while time.monotonic() < stop_at[0]:
        try:
            with urllib.request.urlopen(base + "/get_model_info", timeout=30) as response:
                load = json.loads(response.read())["load"]
        except OSError:
            load = {}
        samples.append({"t": time.monotonic(), "machine_load": os.getloadavg()[0], **load})
        time.sleep(1.0)


def push_loop(base: str, checkpoints: list[Path], pushes: int, gap: float) -> list[dict]:
    done = []
    for i in range(pushes):
        time.sleep(gap)
        path = checkpoints[i % 2]
        start = time.monotonic()
        status, answer, _v = post(
            base + "/update_weights_from_disk",
            {"model_path": str(path), "weight_version": str(i + 1)},
        )
        done.append({"start": start, "end": time.monotonic(), "status": status,
                     "success": answer.get("success"), "load_s": answer.get("load_s"),
                     "version": str(i + 1), "path": path.name})  # fmt: skip
    return done


def summarise(requests: list[dict], pushes: list[dict], seconds: float) -> dict:
    def overlaps(r: dict) -> bool:
        return any(r["start"] < p["end"] and r["end"] > p["start"] for p in pushes)

    ok = [r for r in requests if r["status"] == 200]
    during = [r["end"] - r["start"] for r in ok if overlaps(r)]
    outside = [r["end"] - r["start"] for r in ok if not overlaps(r)]
    push_s = [p["end"] - p["start"] for p in pushes]
    t0 = min(r["start"] for r in requests)
    return {
        "requests": len(requests),
        "requests_per_s": round(len(requests) / seconds, 2),
        "failures": len(requests) - len(ok) + sum(not p["success"] for p in pushes),
        "failed_examples": [r["error"] for r in requests if r["status"] != 200][:3],
        "served_during_pushes": len(during),
        "latency_during_push_ms": {
            "p50": round(pct(during, 0.5) * 1000),
            "p99": round(pct(during, 0.99) * 1000),
        }
        if during
        else None,
        "latency_outside_ms": {
            "p50": round(pct(outside, 0.5) * 1000),
            "p99": round(pct(outside, 0.99) * 1000),
        },
        "push_s": {"p50": round(pct(push_s, 0.5), 3), "max": round(max(push_s), 3)},
        "load_s": {"p50": round(pct([p["load_s"] or 0 for p in pushes], 0.5), 3)},
        "versions_seen": sorted({r["version"] for r in ok}, key=lambda v: int(v or -1)),
        "pushes": [
            {**p, "start": round(p["start"] - t0, 3), "end": round(p["end"] - t0, 3)}
            for p in pushes
        ],
        "requests_log": [
            {
                "start": round(r["start"] - t0, 3),
                "latency_s": round(r["end"] - r["start"], 3),
                "status": r["status"],
                "version": r["version"],
                "path": r["path"],
                "during_push": overlaps(r),
            }
            for r in requests
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--gap", type=float, default=6.0, help="seconds between pushes")
    args = parser.parse_args()
    model = ensure_model("smollm2-135m-instruct", log=print)
    with tempfile.TemporaryDirectory(prefix="serve-push-") as tmp:
        work = Path(tmp)
        print("writing a perturbed copy of the model (the second checkpoint)")
        checkpoints = [perturbed_copy(model, work / "perturbed"), model]
        port = free_port_pair()
        base = f"http://127.0.0.1:{port}"
        log_path = work / "serve.log"
        server = spawn(["pipeline.cli", "serve", "--model", str(model), "--port", str(port),
                        "--loglevel", "warning"], dict(os.environ), log_path)  # fmt: skip
        try:
            wait_http(base + "/health", server, log_path)
            result = run(base, checkpoints, args)
        finally:
            stop(server)
    result.update(model="smollm2-135m-instruct", clients=args.clients, gap_s=args.gap)
    write_result("serve_push", result)
    report(result)


def run(base: str, checkpoints: list[Path], args: argparse.Namespace) -> dict:
    requests: list[dict] = []
    stop_at = [float("inf")]
    samples: list[dict] = []
    threads = [threading.Thread(target=client, args=(base, i, stop_at, requests))
               for i in range(args.clients)]  # fmt: skip
    threads.append(threading.Thread(target=sampler, args=(base, stop_at, samples)))
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    for thread in threads:
        thread.start()
    pushes = push_loop(base, checkpoints, args.pushes, args.gap)
    time.sleep(args.gap)
    stop_at[0] = time.monotonic()
    for thread in threads:
        thread.join()
    warm = [r for r in requests if r["start"] >= started + 2.0]  # connections and caches warm
    result = summarise(warm, pushes, time.monotonic() - started - 2.0)
    result["load_average_1m"] = {"before": load_before, "after": os.getloadavg()[0]}
    t0 = min(r["start"] for r in warm)
    result["engine_samples"] = [{**s, "t": round(s["t"] - t0, 1)} for s in samples]
    steps = sorted(s["step_ms"] for s in samples if s.get("step_ms"))
    result["engine_step_ms"] = {"p50": steps[len(steps) // 2], "max": steps[-1]} if steps else None
    return result


def report(result: dict) -> None:
    during, outside = result["latency_during_push_ms"] or {}, result["latency_outside_ms"]
    rows = [
        ("requests (after 2 s warm-up)", result["requests"]),
        ("requests/s", result["requests_per_s"]),
        ("pushes", len(result["pushes"])),
        ("requests served during pushes", result["served_during_pushes"]),
        ("failures (requests + pushes)", result["failures"]),
        ("latency p50 / p99 during a push (ms)", f"{during.get('p50')} / {during.get('p99')}"),
        ("latency p50 / p99 outside pushes (ms)", f"{outside['p50']} / {outside['p99']}"),
        ("push time p50 / max (s)", f"{result['push_s']['p50']} / {result['push_s']['max']}"),
        ("weight load p50 (s)", result["load_s"]["p50"]),
        (
            "engine loop p50 / max (ms)",
            "{p50} / {max}".format(**(result["engine_step_ms"] or {"p50": "-", "max": "-"})),
        ),
        ("versions seen in answers", ",".join(result["versions_seen"])),
        (
            "machine load (1 min) before / after",
            "{before:.1f} / {after:.1f}".format(**result["load_average_1m"]),
        ),
    ]
    print()
    for name, value in rows:
        print(f"{name:<40}{value!s:>24}")
    print(f"\nwritten to {REPO / 'benchmarks' / 'results' / 'serve_push.json'}")


if __name__ == "__main__":
    main()
