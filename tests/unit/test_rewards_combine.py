"""Weighted processors from YAML (errors name file and key) and the rule + model hybrid."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from pipeline.errors import ConfigError, RewardError
from pipeline.events import NextState, Response
from pipeline.judge.rules import RulesJudge
from pipeline.rewards import (
    HybridReward,
    RewardInput,
    RewardOutput,
    TaskStatus,
    WeightedProcessor,
    WeightedReward,
    load_weighted,
    run_processor,
    setup_processor,
)
from pipeline.rewards.prm import PrmJudge

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rewards"


class Fixed:
    """Returns a fixed output and counts its calls."""

    def __init__(
        self, score: float = 1.0, metrics: dict[str, float] | None = None, error: str = ""
    ):
        self.out = RewardOutput.failed(error) if error else RewardOutput.success(score, metrics)
        self.calls = 0
        self.set_up = False

    def setup(self) -> None:
        self.set_up = True

    async def process(self, input: RewardInput) -> RewardOutput:
        self.calls += 1
        return self.out


def turn(response: str, next_content: str) -> RewardInput:
    return RewardInput(
        agent_output={"messages": [{"role": "user", "content": "Run the tests."}]},  # type: ignore[arg-type]
        response=Response(content=response),
        next_state=NextState(role="user", content=next_content),
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rewards.yaml"
    path.write_text(text)
    return path


async def test_weighted_sum_with_per_metric_weights() -> None:
    accuracy = Fixed(0.5, {"exact": 0.0, "partial": 1.0})
    safety = Fixed(1.0)
    combined = WeightedReward(
        [
            WeightedProcessor("accuracy", accuracy, 0.6, {"exact": 0.3, "partial": 0.7}),
            WeightedProcessor("safety", safety, 0.4),
        ]
    )
    combined.setup()
    assert accuracy.set_up and safety.set_up
    out = await run_processor(combined, RewardInput())
    # accuracy by its metrics: 0.3 * 0.0 + 0.7 * 1.0 = 0.7 (its own 0.5 is not used)
    # total: 0.6 * 0.7 + 0.4 * 1.0 = 0.82
    assert out.score == pytest.approx(0.82)
    assert out.reward is not None
    assert out.reward.reward_metrics == pytest.approx(
        {"accuracy": 0.7, "accuracy/exact": 0.0, "accuracy/partial": 1.0, "safety": 1.0}
    )


async def test_a_metric_weight_naming_an_unreported_metric_is_an_error() -> None:
    combined = WeightedReward(
        [WeightedProcessor("acc", Fixed(1.0, {"exact": 1.0}), 1.0, {"f1": 1.0})]
    )
    with pytest.raises(RewardError, match=r"names metric\(s\) f1 .* reported: exact"):
        await run_processor(combined, RewardInput())


async def test_one_failed_processor_fails_the_combination() -> None:
    combined = WeightedReward(
        [
            WeightedProcessor("rule", Fixed(1.0), 0.5),
            WeightedProcessor("judge", Fixed(error="judge timed out"), 0.5),
        ]
    )
    out = await run_processor(combined, RewardInput())
    assert out.status is TaskStatus.FAILED and out.error == "judge: judge timed out"


async def test_the_shipped_rewards_file_loads_and_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNSTREAM_SCORING_JUDGE", raising=False)
    monkeypatch.delenv("TURNSTREAM_CONFIG", raising=False)
    combined = load_weighted(EXAMPLES / "rewards.yaml")
    combined.setup()
    assert [(m.name, m.weight) for m in combined.members] == [("safety", 0.4), ("quality", 0.6)]
    out = await run_processor(combined, turn("All 42 tests passed.", "That's wrong, try again."))
    # safety by metrics: 0.5 * toxicity 1.0 + 0.5 * refusal 1.0 = 1.0
    # quality: rule passes (1.0); the rules judge reads a redo request: -1
    #   0.2 * 1.0 + 0.8 * -1.0 = -0.6
    # total: 0.4 * 1.0 + 0.6 * -0.6 = 0.04
    assert out.score == pytest.approx(0.04)
    await combined.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("processors: [", "rewards.yaml: not valid YAML"),
        ("", "rewards.yaml: (top level): name at least one reward: a list under processors"),
        ("processors: []", "rewards.yaml: (top level): name at least one reward"),
        ("processors:\n  - weight: 1.0\n", "rewards.yaml: processors[0].classpath: required key"),
        (
            "processors:\n  - classpath: examples.rewards.demo:DemoRewardProcessor\n"
            "    wieght: 2\n",
            "rewards.yaml: processors[0].wieght: unknown key",
        ),
        (
            "processors:\n  - classpath: examples.rewards.demo:DemoRewardProcessor\n"
            "    weight: .nan\n",
            "rewards.yaml: processors[0].weight: must be a finite number",
        ),
        (
            "processors:\n  - classpath: examples.rewards.demo:DemoRewardProcessor\n"
            "  - classpath: no_such_pkg.mod:X\n",
            "rewards.yaml: processors[1].classpath: no module named 'no_such_pkg'",
        ),
        (
            "processors:\n  - classpath: examples.rewards.demo:DemoRewardProcessor\n"
            "  - classpath: examples.rewards.demo:DemoRewardProcessor\n",
            "rewards.yaml: processors[1].name: 'DemoRewardProcessor' is already the name of "
            "processors[0]",
        ),
        (
            "processors:\n  - classpath: examples.rewards.rules:ResponseRule\n"
            "    options: {max_len: 3}\n",
            "rewards.yaml: processors[0].classpath: examples.rewards.rules:ResponseRule cannot "
            "be built with max_len",
        ),
    ],
)
def test_bad_rewards_files_name_the_file_and_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_weighted(path)
    assert message in str(err.value).replace(str(tmp_path) + "/", "")


def saved(name: str) -> float:
    value = REGISTRY.get_sample_value(
        "turnstream_reward_judge_calls_saved_total", {"processor": name}
    )
    return value or 0.0


async def test_hybrid_short_circuits_a_failed_rule_without_asking_the_judge() -> None:
    rule, model = Fixed(0.0, {"has_json": 0.0}), Fixed(1.0)
    hybrid = HybridReward(rule, model, w_rule=0.3, w_model=0.7, name="hybrid-a")
    before = saved("hybrid-a")
    out = await run_processor(hybrid, RewardInput())
    assert out.status is TaskStatus.SUCCESS and out.score == 0.0  # a valid 0, not FAILED
    assert model.calls == 0 and rule.calls == 1
    assert hybrid.judge_calls_saved == 1 and saved("hybrid-a") == before + 1
    assert out.reward is not None
    assert out.reward.reward_metrics == {"rule": 0.0, "rule/has_json": 0.0, "rule_pass": 0.0}


async def test_hybrid_weighs_rule_and_model_when_the_rule_passes() -> None:
    rule, model = Fixed(0.5), Fixed(-1.0, {"judge_calls": 3.0})
    hybrid = HybridReward(rule, model, w_rule=0.3, w_model=0.7, name="hybrid-b")
    out = await run_processor(hybrid, RewardInput())
    # rule_pass 1 (0.5 > 0): 1 * (0.3 * 0.5 + 0.7 * -1.0) = -0.55
    assert out.score == pytest.approx(-0.55) and model.calls == 1
    assert hybrid.judge_calls_saved == 0
    assert out.reward is not None and out.reward.reward_metrics["model/judge_calls"] == 3.0

    strict = HybridReward(Fixed(0.5), Fixed(1.0), w_rule=0.3, w_model=0.7, pass_above=0.5)
    assert (await run_processor(strict, RewardInput())).score == 0.0  # 0.5 is not above 0.5


async def test_hybrid_fails_when_a_part_fails() -> None:
    out = await run_processor(
        HybridReward(Fixed(error="regex timeout"), Fixed(), 0.5, 0.5), RewardInput()
    )
    assert out.status is TaskStatus.FAILED and out.error == "rule: regex timeout"
    out = await run_processor(
        HybridReward(Fixed(1.0), Fixed(error="judge down"), 0.5, 0.5), RewardInput()
    )
    assert out.status is TaskStatus.FAILED and out.error == "model: judge down"


async def test_hybrid_from_class_paths_with_the_rules_judge() -> None:
    hybrid = HybridReward(
        rule={"classpath": "examples.rewards.rules:ResponseRule", "options": {"max_chars": 20}},
        model=PrmJudge(RulesJudge()),
        w_rule=0.2,
        w_model=0.8,
        name="hybrid-c",
    )
    setup_processor(hybrid)
    ok = await run_processor(hybrid, turn("Done.", "Thanks!"))
    assert ok.score == pytest.approx(1.0)  # 0.2 * 1 + 0.8 * 1
    too_long = await run_processor(hybrid, turn("x" * 21, "Thanks!"))
    assert too_long.score == 0.0 and hybrid.judge_calls_saved == 1
    assert too_long.reward is not None
    assert too_long.reward.reward_metrics["rule/within_length"] == 0.0
    with pytest.raises(RewardError, match=r"hybrid\.rule: expected \{classpath, options\}"):
        HybridReward({"path": "x:Y"}, Fixed(), 0.5, 0.5)
