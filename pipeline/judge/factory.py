"""One factory for the configured judge (and OPD teacher).

The scoring worker, ``turnstream rescore`` and the reward processors
(pipeline.rewards.prm, pipeline.rewards.pairwise) build their judge here, from
the same settings; nothing here imports Faust.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from pipeline.errors import ConfigError
from pipeline.events import JudgeIdentity
from pipeline.judge.asking import HttpJudge, Judge
from pipeline.judge.client import JUDGE_RETRY, JudgeClient, JudgeConfig
from pipeline.judge.prompts import PROMPT_VERSION
from pipeline.judge.rules import RulesJudge
from pipeline.judge.teacher import PolicyTokenizer, Teacher
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def judge_identity(
    backend: Literal["rules", "sglang", "openai"], model: str | None, urls: list[str]
) -> JudgeIdentity:
    return JudgeIdentity(backend=backend, model=model, prompt_version=PROMPT_VERSION, urls=urls)


def _client_config(settings: Settings, **fields: Any) -> JudgeConfig:
    """The HTTP client settings the judge and the teacher share: timeouts, retries,
    concurrency; ``fields`` set the rest."""
    s = settings.scoring
    retry = replace(
        JUDGE_RETRY, max_attempts=s.judge_max_attempts, max_delay_s=s.judge_backoff_max_s
    )
    return JudgeConfig(
        timeout_s=s.judge_timeout_s, retry=retry, concurrency=s.judge_concurrency, **fields
    )


def judge_client(settings: Settings) -> JudgeClient:
    """The HTTP client of the configured SGLang or OpenAI-compatible judge."""
    s = settings.scoring
    if s.judge == "rules":
        raise ConfigError("the rules judge has no HTTP client: set --judge sglang or openai")
    config = _client_config(
        settings,
        backend=s.judge,
        urls=s.judge_urls,
        model=s.judge_model,
        api_key=s.judge_api_key.get_secret_value() if s.judge_api_key else None,
        temperature=s.judge_temperature,
        max_new_tokens=s.judge_max_new_tokens,
        hint_max_new_tokens=2 * s.judge_max_new_tokens,
        batch_max=s.judge_batch_max,
        batch_wait_s=s.judge_batch_wait_ms / 1000,
        constrained=s.judge_constrained,
        reason_chars=s.judge_reason_chars,
    )
    render = _chat_renderer(s.judge_tokenizer) if s.judge == "sglang" else None
    return JudgeClient(config, render) if render else JudgeClient(config)


def teacher_client(settings: Settings) -> JudgeClient:
    """The HTTP client of the OPD teacher's own SGLang servers (TURNSTREAM_SCORING_TEACHER_URLS),
    with the judge's timeout, retries and concurrency."""
    urls = settings.scoring.teacher_urls
    if not urls:
        raise ConfigError("no teacher server: set TURNSTREAM_SCORING_TEACHER_URLS (--teacher-url)")
    return JudgeClient(_client_config(settings, backend="sglang", urls=urls, role="teacher"))


def build_judge(settings: Settings) -> tuple[Judge, Teacher | None]:
    """The configured judge, and the OPD teacher when the mode needs one.

    The settings model has already checked the combinations (a URL for an HTTP
    judge, a teacher server or an SGLang judge and a policy tokenizer for a teacher).
    """
    s = settings.scoring
    client = None if s.judge == "rules" else judge_client(settings)
    judge: Judge
    if client is None:
        judge = RulesJudge()
    else:
        identity = judge_identity(s.judge, s.judge_model, list(s.judge_urls))
        judge = HttpJudge(client, identity, m=s.m, vote_mode=s.vote_mode, hint_m=s.hint_m)
    return judge, _teacher(settings, client)


def _teacher(settings: Settings, judge: JudgeClient | None) -> Teacher | None:
    """The teacher at the teacher URLs, else at the SGLang judge's server (OpenClaw-RL's
    choice: the PRM serves teacher log-probs); None in rl mode or without either."""
    s = settings.scoring
    if s.mode == "rl":
        return None
    if s.teacher_urls:
        client = teacher_client(settings)
    elif judge is not None and s.judge == "sglang":
        client = judge
    else:
        log.warning(
            "the %s judge gives hints but no teacher log-probs (mode %s): set "
            "TURNSTREAM_SCORING_TEACHER_URLS for a teacher",
            s.judge,
            s.mode,
        )
        return None
    if s.policy_tokenizer is None:  # the settings refuse this; a hand-built object may not
        raise ConfigError(f"mode {s.mode} needs TURNSTREAM_SCORING_POLICY_TOKENIZER")
    return Teacher(client, PolicyTokenizer(s.policy_tokenizer), s.teacher_top_k, s.teacher_contrast)


def _chat_renderer(tokenizer_path: Any) -> Callable[[Sequence[dict[str, Any]]], str] | None:
    """The judge model's chat template from a local tokenizer, or ChatML without one."""
    if tokenizer_path is None:
        log.warning("no judge tokenizer configured: SGLang prompts use a ChatML template")
        return None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
    return lambda messages: str(
        tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    )
