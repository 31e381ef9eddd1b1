"""The default judge (SmolLM2-135M fine-tuned on examples/judge/train.jsonl), served and asked
as the scoring worker asks it: m=3 constrained votes in one request, majority vote."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.judge.rules import RulesJudge
from pipeline.judge_model.build import read_judge_manifest
from pipeline.rewards import agreement as gold
from pipeline.rewards.prm import PrmJudge, judge_from_settings
from pipeline.serving.server import ServerState
from pipeline.settings import ScoringSettings, Settings
from tests.conftest import REPO
from tests.servers import embedded_server, get

HELDOUT = REPO / "examples" / "judge" / "heldout.jsonl"


@pytest.fixture(scope="module")
def served_judge(smollm2_judge: Path) -> Iterator[tuple[str, ServerState]]:
    with embedded_server(smollm2_judge) as running:
        yield running


def agreement_of(processor: PrmJudge, items: list[gold.GoldItem]) -> gold.AgreementReport:
    async def run() -> list[gold.RewardOutput]:
        try:
            return await gold.score_gold(processor, items, concurrency=16)
        finally:
            await processor.close()

    outputs = asyncio.run(run())
    failed_votes = sum(o.reward.reward_metrics.get("failed_votes", 0) for o in outputs if o.reward)
    assert failed_votes == 0, "a constrained vote ended without a valid score box"
    return gold.report(items, outputs)


def test_the_server_says_it_serves_a_trained_judge(
    served_judge: tuple[str, ServerState], smollm2_judge: Path
) -> None:
    url, _state = served_judge
    info = get(url + "/get_model_info")
    manifest = read_judge_manifest(smollm2_judge)
    assert manifest is not None and info["turnstream_judge"]["prompt_version"] == "v2"
    assert info["turnstream_judge"]["base"] == manifest["base"] == "smollm2-135m-instruct"


def test_the_default_judge_agrees_with_the_heldout_gold_set(
    served_judge: tuple[str, ServerState], smollm2_judge: Path
) -> None:
    url, _state = served_judge
    items = gold.load_gold(HELDOUT)
    settings = Settings(
        scoring=ScoringSettings(
            judge="sglang", judge_urls=[url], judge_tokenizer=smollm2_judge, m=3
        )  # judge_constrained auto: the server's model info turns the regex on
    )
    trained = agreement_of(PrmJudge(judge_from_settings(settings)), items)
    rules = agreement_of(PrmJudge(RulesJudge()), items)
    print(f"trained judge:\n{gold.render(trained)}\nrules judge:\n{gold.render(rules)}")
    assert trained.n == len(items) and not trained.failed
    assert trained.kappa is not None and rules.kappa is not None
    assert trained.kappa >= rules.kappa + 0.15
    # measured 0.817 (rules 0.34) for the judge built at this data and these options (the
    # goal: 0.8); its votes are sampled at temperature 0.6, so the floor leaves room for
    # that, and a judge below it has regressed (the one before this data scored 0.62)
    assert trained.kappa >= 0.75
