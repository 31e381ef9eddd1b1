"""The processes of a live run: policy server, capture proxy, scoring worker, trainer.

Each is a `turnstream` child process with its log in the run's directory; the
caller stops them together (``pipeline.processes.Children``) on the way out.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import TurnstreamError
from pipeline.processes import fresh_dir, spawn_cli, stop_processes, wait_http_ok
from pipeline.settings import Settings

Proc = subprocess.Popen[bytes]
CONSOLE_START_S = 60.0  # the console answers within seconds; past this the run goes on without


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The run's Kafka and topic names for every child, plus ``extra`` variables."""
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TURNSTREAM_TOPIC_PREFIX": settings.topic_prefix,
        **extra,
    }


@dataclass(frozen=True)
class Served:
    proc: Proc
    url: str


def start_server(
    settings: Settings,
    model: Path,
    workdir: Path,
    name: str,
    threads: int | None,
    max_running: int | None = None,
) -> Served:
    """`turnstream serve` on ``model``; returns once it answers /health. ``max_running``:
    sequences it decodes together (None: the server's default, 16).

    It reports log-probs before temperature scaling, as the trainer computes them.
    """
    port = free_port()
    log = workdir / f"{name}.log"
    args = ["serve", "--model", str(model), "--port", str(port), "--loglevel", "warning"]
    if threads:
        args += ["--threads", str(threads)]
    if max_running:
        args += ["--max-running-requests", str(max_running)]
    env = child_env(settings, TURNSTREAM_SERVE_RETURN_ORIGINAL_LOGPROB="true")
    proc = spawn_cli(args, env, log)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(url + "/health", proc, log, f"the {name} server")
    return Served(proc, url)


def start_proxy(settings: Settings, upstream: str, workdir: Path) -> Served:
    """`turnstream proxy` in front of ``upstream``, asking it for token ids and log-probs."""
    port = free_port()
    log = workdir / "proxy.log"
    args = ["proxy", "--upstream", upstream, "--port", str(port), "--loglevel", "warning"]
    args += ["--data-dir", str(workdir / "proxy")]
    env = child_env(settings, TURNSTREAM_PROXY_TOKEN_IDS="true", TURNSTREAM_PROXY_LOGPROBS="true")
    proc = spawn_cli(args, env, log)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(url + "/healthz", proc, log, "the capture proxy")
    return Served(proc, url)


@dataclass(frozen=True)
class Judge:
    """An LLM judge for the worker: its base URL, and the tokenizer whose chat template
    renders SGLang /generate prompts (None: an OpenAI-compatible /v1/chat/completions)."""

    url: str
    tokenizer: Path | None = None
    max_new_tokens: int | None = None  # per vote; None: the scoring settings' default


def judge_backend(judge: Judge | None) -> str:
    """The worker's judge backend for ``judge``: rules, sglang (the embedded server's
    /generate, n votes at once) or openai."""
    if judge is None:
        return "rules"
    return "sglang" if judge.tokenizer is not None else "openai"


@dataclass(frozen=True)
class TeacherServer:
    """The OPD teacher for the worker: an SGLang /generate server (the initial weights or the
    served policy, asked with the hint-augmented prompt), the policy's tokenizer, top-K (0:
    off)."""

    url: str
    tokenizer: Path
    top_k: int = 0
    contrast: bool = False  # also asked with a neutral line: hinted - neutral trains

    def env(self) -> dict[str, str]:
        return {
            "TURNSTREAM_SCORING_TEACHER_URLS": self.url,
            "TURNSTREAM_SCORING_POLICY_TOKENIZER": str(self.tokenizer),
            "TURNSTREAM_SCORING_TEACHER_TOP_K": str(self.top_k),
            "TURNSTREAM_SCORING_TEACHER_CONTRAST": str(self.contrast).lower(),
        }


def start_teacher(
    settings: Settings,
    model: Path,
    workdir: Path,
    policy_url: str,
    mode: str,
    teacher: str,
    top_k: int,
    rows: int,
) -> tuple[TeacherServer | None, Served | None]:
    """opd and combine: the teacher, asked with the hint-augmented prompt (prefill only:
    max_new_tokens 0), and the server started for it (None: none was).

    ``initial``: ``model`` (the weights before learning) on a server of its own, which no
    push reaches, prefilling ``rows`` sequences together. ``policy``: the served policy at
    ``policy_url`` (a push never fails those calls: requests admitted before a swap finish
    on their weights). An answer cut short (SGLang's abort) is asked again by the worker,
    never taken as a signal. rl: no teacher."""
    if mode == "rl":
        return None, None
    if teacher == "policy":
        return TeacherServer(policy_url, model, top_k), None
    served = start_server(settings, model, workdir, "teacher", 1, rows)
    return TeacherServer(served.url, model, top_k), served


def start_worker(
    settings: Settings,
    workdir: Path,
    judge: Judge | None,
    mode: str = "rl",
    teacher: TeacherServer | None = None,
) -> Proc:
    """A scoring worker in ``mode``: the rules judge, or the LLM judge ``judge``; in opd and
    combine its teacher log-probs come from ``teacher``."""
    args = ["worker", "--web-port", "0", "--data-dir", str(workdir / "worker")]
    extra: dict[str, str] = {"TURNSTREAM_SCORING_MODE": mode}
    if teacher is not None:
        extra.update(teacher.env())
    args += ["--judge", judge_backend(judge)]
    if judge is not None:
        args += ["--judge-url", judge.url]
        if judge.tokenizer is not None:
            extra["TURNSTREAM_SCORING_JUDGE_TOKENIZER"] = str(judge.tokenizer)
        else:
            extra["TURNSTREAM_SCORING_JUDGE_MODEL"] = "default"
        if judge.max_new_tokens is not None:
            extra["TURNSTREAM_SCORING_JUDGE_MAX_NEW_TOKENS"] = str(judge.max_new_tokens)
    env = child_env(settings, **extra)
    return spawn_cli([*args, "--loglevel", "warn"], env, workdir / "worker.log")


@dataclass(frozen=True)
class TrainerFiles:
    config: Path
    metrics: Path
    ledger: Path
    log: Path


def trainer_files(workdir: Path) -> TrainerFiles:
    base = workdir / "trainer"
    return TrainerFiles(
        base / "trainer.yaml", base / "metrics.jsonl", base / "ledger.tsv", workdir / "trainer.log"
    )


def start_trainer(
    settings: Settings, model: Path, policy_url: str, workdir: Path, options: dict[str, Any]
) -> tuple[Proc, TrainerFiles]:
    """`turnstream train` from ``model``'s weights, pushing every version to ``policy_url``;
    ``options`` (LearnOptions.trainer_options) hold its mode and step settings."""
    files = trainer_files(workdir)
    fresh_dir(files.config.parent)  # a run's trainer starts from the model, never an old run
    config = {
        "model_path": str(model),
        "policy_urls": [policy_url],
        "checkpoint_dir": str(files.config.parent / "ckpt"),
        "weights_dir": str(files.config.parent / "weights"),
        "metrics_jsonl": str(files.metrics),
        "keep_checkpoints": 1,
        "keep_weight_versions": 1,
        **options,
    }
    files.config.write_text(yaml.safe_dump(config, sort_keys=False))
    args = ["train", "--config", str(files.config), "--ledger", str(files.ledger)]
    return spawn_cli(args, child_env(settings), files.log), files


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on ``host``:``port`` (a console started there would
    exit, and the page at that address would be someone else's)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def start_console(
    settings: Settings, workdir: Path, port: int | None, tokenizer: Path | None
) -> Served:
    """`turnstream console`, read-only, on the run's broker and topics, at ``port`` (None: the
    console's setting; 0: a free one); returns once it answers /api/status. ``tokenizer``:
    the policy's, to show OPD tokens as text. A console that does not answer is stopped and
    a TurnstreamError saying why (its log's tail) is raised: the caller warns and goes on."""
    host = settings.console.host
    port = settings.console.port if port is None else (port or free_port())
    if port_in_use(host, port):
        raise TurnstreamError(f"port {port} on {host} is in use: give --console-port")
    args = ["console", "--host", host, "--port", str(port), "--loglevel", "warning"]
    if tokenizer is not None:
        args += ["--tokenizer", str(tokenizer)]
    log = workdir / "console.log"
    proc = spawn_cli(args, child_env(settings), log)
    url = f"http://{host}:{port}/"
    try:
        wait_http_ok(url + "api/status", proc, log, "the console", CONSOLE_START_S)
    except TurnstreamError:
        stop_processes([proc])
        raise
    return Served(proc, url)
