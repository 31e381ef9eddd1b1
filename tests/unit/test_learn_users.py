"""The simulated users' preference, the replies the judge reads, the prompt set, evaluation."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.errors import ConfigError
from pipeline.learn.evaluate import Answer, summarize
from pipeline.learn.preference import Brevity, word_count
from pipeline.learn.prompts import default_prompts, load_prompts, split
from pipeline.learn.users import served_version
from pipeline.scoring.judge.rules import RulesJudge


def test_brevity_is_met_only_by_an_answer_that_ends_by_itself_within_the_limit() -> None:
    users = Brevity(max_words=5)
    assert users.met("Paris is the capital.", "stop")
    assert users.met("one two three four five", "stop")
    assert not users.met("one two three four five six", "stop")
    assert not users.met("Paris.", "length")  # cut at max_tokens: not an answer that ended
    assert not users.met("", "stop") and not users.met(None, "stop")
    assert word_count("  a\nb\tc  ") == 3


def test_the_rules_judge_scores_the_users_replies_plus_and_minus_one_never_zero() -> None:
    users = Brevity()
    assert RulesJudge.vote("user", users.reply(True)) == 1
    assert RulesJudge.vote("user", users.reply(False)) == -1


def test_the_shipped_prompt_set_has_a_held_out_split_of_at_least_64_unseen_prompts() -> None:
    prompts = load_prompts(default_prompts())
    train, heldout = split(prompts, "train"), split(prompts, "heldout")
    assert len(heldout) >= 64 and len(train) >= 3 * len(heldout) - 10
    assert not {p.text for p in train} & {p.text for p in heldout}
    assert len({p.id for p in prompts}) == len(prompts)


def test_a_bad_prompt_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "split": "train", "prompt": "hi"}\n{"id": "b", "split": "x"}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: expected an object"):
        load_prompts(path)
    path.write_text('{"id": "a", "split": "test", "prompt": "hi"}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:1: split must be one of"):
        load_prompts(path)
    path.write_text('{"id": "a", "split": "train", "prompt": "hi"}\n')
    with pytest.raises(ConfigError, match="no 'heldout' prompts"):
        split(load_prompts(path), "heldout")


def test_the_served_version_comes_from_the_servers_metadata() -> None:
    assert served_version(SimpleNamespace(model_extra={"metadata": {"weight_version": "3"}})) == 3
    assert (
        served_version(SimpleNamespace(model_extra={"metadata": {"weight_version": "x"}})) is None
    )
    assert served_version(SimpleNamespace(model_extra={})) is None
    assert served_version(SimpleNamespace(metadata={"weight_version": "2"})) == 2


def test_evaluation_rate_length_and_versions() -> None:
    answers = [
        Answer("a", 4, True, 0, True),
        Answer("b", 40, False, 0, False),
        Answer("c", 9, True, 1, True),
        Answer("d", 31, False, None, True),
    ]
    result = summarize("after", answers)
    assert (result.n, result.met, result.rate) == (4, 2, 0.5)
    assert result.mean_words == pytest.approx(21.0)
    assert result.versions == {"0": 2, "1": 1, "unknown": 1}
    assert result.to_json()["rate"] == 0.5
    assert summarize("empty", []).rate == 0.0
