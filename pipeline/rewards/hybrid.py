"""Rule + model hybrid: a cheap rule gates an expensive model judge.

``final = rule_pass * (w_rule * rule_score + w_model * model_score)``. The rule
is a hard constraint (format, length, required fields, banned words): it passes
when its score is above ``pass_above`` (default 0). When it fails the result is
a SUCCESS with score 0 and the model judge is not asked: a judge run saved
(counted on ``judge_calls_saved`` and ``turnstream_reward_judge_calls_saved_total``),
and an output that breaks the rule cannot talk its way past the judge.
"""

from __future__ import annotations

import math
from typing import Any

from pipeline.errors import RewardError
from pipeline.rewards import metrics
from pipeline.rewards.loading import load_processor
from pipeline.rewards.protocols import (
    RewardProcessor,
    close_processor,
    run_processor,
    setup_processor,
)
from pipeline.rewards.types import RewardInput, RewardOutput

# A processor as a rewards file or a caller gives it: an instance, ``module:Class``, or
# ``{classpath, options}``.
ProcessorSpec = RewardProcessor | str | dict[str, Any]


def as_processor(spec: ProcessorSpec, where: str) -> RewardProcessor:
    """A processor instance, a ``module:Class`` string, or ``{classpath, options}``."""
    if isinstance(spec, str):
        return load_processor(spec, where=f"{where}: ")
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {"classpath", "options"})
        if "classpath" not in spec or unknown:
            raise RewardError(
                f"{where}: expected {{classpath, options}}, got keys {', '.join(sorted(spec))}"
            )
        return load_processor(spec["classpath"], spec.get("options"), where=f"{where}: ")
    if callable(getattr(spec, "process", None)):
        return spec
    raise RewardError(f"{where}: {type(spec).__name__} is not a reward processor")


class HybridReward:
    """A rule processor gating a model processor, weighted."""

    __reward_name__ = "hybrid"

    def __init__(
        self,
        rule: ProcessorSpec,
        model: ProcessorSpec,
        w_rule: float,
        w_model: float,
        pass_above: float = 0.0,
        name: str = "hybrid",
    ) -> None:
        for key, value in (("w_rule", w_rule), ("w_model", w_model), ("pass_above", pass_above)):
            if not math.isfinite(value):
                raise RewardError(f"{name}: {key} must be a finite number, got {value}")
        self.rule = as_processor(rule, f"{name}.rule")
        self.model = as_processor(model, f"{name}.model")
        self.w_rule, self.w_model, self.pass_above = w_rule, w_model, pass_above
        self.name = name
        self.judge_calls_saved = 0

    def setup(self) -> None:
        setup_processor(self.rule)
        setup_processor(self.model)

    async def close(self) -> None:
        await close_processor(self.rule)
        await close_processor(self.model)

    async def process(self, input: RewardInput) -> RewardOutput:
        rule_out = await run_processor(self.rule, input)
        if not rule_out.ok:
            return RewardOutput.failed(f"rule: {rule_out.error}")
        rule_score = rule_out.score
        found = {"rule": rule_score, **_prefixed("rule", rule_out)}
        if rule_score <= self.pass_above:
            self.judge_calls_saved += 1
            metrics.JUDGE_CALLS_SAVED.labels(self.name).inc()
            return RewardOutput.success(0.0, {**found, "rule_pass": 0.0})
        model_out = await run_processor(self.model, input)
        if not model_out.ok:
            return RewardOutput.failed(f"model: {model_out.error}")
        model_score = model_out.score
        final = self.w_rule * rule_score + self.w_model * model_score
        found |= {"rule_pass": 1.0, "model": model_score, **_prefixed("model", model_out)}
        return RewardOutput.success(final, found)


def _prefixed(prefix: str, out: RewardOutput) -> dict[str, float]:
    metrics_ = out.reward.reward_metrics if out.reward else {}
    return {f"{prefix}/{key}": value for key, value in metrics_.items()}
