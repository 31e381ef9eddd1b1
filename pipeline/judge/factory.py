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


def judge_client(settings: Settings) -> JudgeClient:
    """The HTTP client of the configured SGLang or OpenAI-compatible judge."""
    s = settings.scoring
    if s.judge == "rules":
        raise ConfigError("the rules judge has no HTTP client: set --judge sglang or openai")
    retry = replace(
        JUDGE_RETRY, max_attempts=s.judge_max_attempts, max_delay_s=s.judge_backoff_max_s
    )
    config = JudgeConfig(
        backend=s.judge,
        urls=s.judge_urls,
        model=s.judge_model,
        api_key=s.judge_api_key.get_secret_value() if s.judge_api_key else None,
        timeout_s=s.judge_timeout_s,
        retry=retry,
        concurrency=s.judge_concurrency,
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


def build_judge(settings: Settings) -> tuple[Judge, Teacher | None]:
    """The configured judge, and the OPD teacher when the mode needs one.

    The settings model has already checked the combinations (a URL for an HTTP
    judge, SGLang and a policy tokenizer for a teacher).
    """
    s = settings.scoring
    if s.judge == "rules":
        if s.mode != "rl":
            log.warning("the rules judge gives hints but no teacher log-probs (mode %s)", s.mode)
        return RulesJudge(), None
    client = judge_client(settings)
    identity = judge_identity(s.judge, s.judge_model, list(s.judge_urls))
    judge = HttpJudge(client, identity, m=s.m, vote_mode=s.vote_mode, hint_m=s.hint_m)
    teacher = None
    if s.mode in ("opd", "combine") and s.policy_tokenizer is not None:
        teacher = Teacher(client, PolicyTokenizer(s.policy_tokenizer), s.teacher_top_k)
    return judge, teacher


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
