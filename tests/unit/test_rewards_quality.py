"""Judge-quality statistics: ranks, rho, kappa, confusion, length bias, pairwise consistency."""

from __future__ import annotations

import math

import pytest
from prometheus_client import REGISTRY

from pipeline.rewards import (
    LengthBias,
    cohen_kappa,
    confusion_table,
    consistent_verdict,
    judge_pairwise,
    length_bias,
    pearson,
    spearman_rho,
)
from pipeline.rewards.agreement import agreement, nearest_label
from pipeline.rewards.stats import average_ranks


def test_average_ranks_share_ties() -> None:
    assert average_ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    assert average_ranks([1, 1, 1]) == [2.0, 2.0, 2.0]


def test_spearman_with_ties_by_hand() -> None:
    x = [1, 2, 2, 3]  # ranks 1, 2.5, 2.5, 4
    y = [1, 3, 2, 4]  # ranks 1, 3, 2, 4
    # centred ranks (mean 2.5): x -1.5, 0, 0, 1.5; y -1.5, 0.5, -0.5, 1.5
    # sum of products 4.5; sxx 4.5; syy 5 -> rho = 4.5 / sqrt(4.5 * 5) = 0.9487
    assert spearman_rho(x, y) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert spearman_rho([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # monotonic but not linear: rho 1, Pearson below 1
    assert spearman_rho([1, 2, 3, 4], [1, 2, 4, 100]) == pytest.approx(1.0)
    r = pearson([1, 2, 3, 4], [1, 2, 4, 100])
    assert r is not None and r < 0.9


def test_undefined_correlations_are_none() -> None:
    assert spearman_rho([1, 1, 1], [1, 2, 3]) is None
    assert pearson([1.0], [2.0]) is None
    with pytest.raises(ValueError, match="equal lengths"):
        spearman_rho([1, 2], [1])


def test_cohen_kappa_by_hand() -> None:
    a = [1, 1, 0, 0, 1, 0]
    b = [1, 0, 0, 0, 1, 1]
    # p_o = 4/6; a: 3 ones, 3 zeros; b: 3 ones, 3 zeros -> p_e = (9 + 9) / 36 = 0.5
    # kappa = (2/3 - 1/2) / (1 - 1/2) = 1/3
    assert cohen_kappa(a, b) == pytest.approx(1 / 3)
    assert cohen_kappa(a, a) == pytest.approx(1.0)
    assert cohen_kappa([1, 1], [1, 1]) is None  # chance agreement 1: undefined


def test_confusion_table_counts_and_renders() -> None:
    table = confusion_table([1, 1, -1, 0], [1, 0, -1, 0])
    assert table.labels == [-1, 0, 1]
    assert table.count(1, 0) == 1 and table.count(1, 1) == 1 and table.count(0, 1) == 0
    lines = table.render().splitlines()
    assert lines[0].split()[-3:] == ["-1", "0", "1"]
    assert lines[3].split() == ["1", "0", "1", "1"]


def test_agreement_bins_scores_to_the_nearest_label() -> None:
    assert nearest_label(0.85, [0, 1]) == 1 and nearest_label(0.5, [0, 1]) == 0
    result = agreement([0, 1, 1, 0], [0.1, 0.85, 0.6, 0.7])
    assert result.table.count(0, 1) == 1 and result.table.count(1, 1) == 2
    # binned [0, 1, 1, 1] vs [0, 1, 1, 0]: p_o 3/4, p_e (2*1 + 2*3)/16 = 1/2 -> kappa 1/2
    assert result.kappa == pytest.approx(0.5)


def gauge(processor: str) -> float | None:
    return REGISTRY.get_sample_value(
        "turnstream_reward_length_bias", {"processor": processor, "method": "spearman"}
    )


def test_length_bias_slides_and_exports_the_gauge() -> None:
    window = LengthBias("lb-test", window=4, min_points=3)
    window.observe(0.0, 10)
    window.observe(0.5, 20)
    assert window.value() is None and math.isnan(gauge("lb-test"))  # too few points yet
    window.observe(1.0, 30)
    assert window.value() == pytest.approx(1.0)  # longer scored higher
    assert gauge("lb-test") == pytest.approx(1.0)
    window.observe(1.0, 40)
    # now the window turns: long answers score low, and the oldest points drop out
    for score, length in [(0.0, 50), (0.0, 60), (0.0, 70)]:
        window.observe(score, length)
    # window: (1.0, 40), (0, 50), (0, 60), (0, 70) -> score falls with length
    value = window.value()
    assert value is not None and value < 0
    assert gauge("lb-test") == pytest.approx(value)
    assert length_bias([1, 1, 1], [5, 6, 7]) is None


def test_length_bias_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="min_points"):
        LengthBias(window=3, min_points=5)
    with pytest.raises(ValueError, match="unknown correlation method"):
        length_bias([1, 2], [1, 2], "kendall")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ab", "ba", "outcome"),
    [
        ("first", "second", "a"),
        ("second", "first", "b"),
        ("tie", "tie", "tie"),
        ("first", "first", "inconsistent"),  # always prefers what it reads first
        ("second", "second", "inconsistent"),
        ("tie", "first", "inconsistent"),
    ],
)
def test_only_a_verdict_that_survives_the_swap_is_kept(ab: str, ba: str, outcome: str) -> None:
    assert consistent_verdict(ab, ba) == outcome  # type: ignore[arg-type]


async def test_judge_pairwise_asks_both_orders() -> None:
    asked: list[tuple[str, str]] = []

    async def longer_wins(first: str, second: str) -> str:
        asked.append((first, second))
        return "first" if len(first) > len(second) else "second"

    def first_wins(first: str, second: str) -> str:
        return "first"

    assert await judge_pairwise(longer_wins, "a long answer", "short") == "a"  # type: ignore[arg-type]
    assert sorted(asked) == [("a long answer", "short"), ("short", "a long answer")]
    assert await judge_pairwise(first_wins, "x", "y") == "inconsistent"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one of"):
        await judge_pairwise(lambda a, b: "A", "x", "y")  # type: ignore[arg-type,return-value]
