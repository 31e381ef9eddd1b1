"""The server's pure parts: sampling params, stop strings in streamed text, version names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.models.convert import ModelError
from pipeline.serving.choose import choose
from pipeline.serving.sampling import BadRequest, Sampling, parse_sampling
from pipeline.serving.text import TextTracker
from pipeline.serving.weights import VERSION_FILE, version_of


def test_sampling_params_take_sglang_defaults_and_names() -> None:
    s = parse_sampling(
        {
            "temperature": 0,
            "stop": "###",
            "skip_special_tokens": False,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }
    )
    assert s.greedy and s.stop == ("###",) and not s.skip_special_tokens and s.no_stop_trim
    assert s.max_new_tokens == 128 and s.top_k == -1
    assert parse_sampling({"top_k": 1 << 30}).top_k == -1
    assert parse_sampling({"top_k": 1, "temperature": 0.7}).greedy


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
        ({"stop": [1]}, "stop"),
        ({"temperature": "hot"}, "temperature"),
        ({"frequency_penalty": 0.5}, "not supported"),
        ({"best_of": 2}, "unknown"),
        ([1], "object"),
    ],
)
def test_bad_sampling_params_say_which(raw: object, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        parse_sampling(raw)


def pieces_decoder(pieces: dict[int, str]):  # type: ignore[no-untyped-def]
    return lambda ids: "".join(pieces[i] for i in ids)


def test_stop_string_across_tokens_is_never_streamed() -> None:
    tracker = TextTracker(
        pieces_decoder({1: "Hello", 2: " wor", 3: "ld", 4: " #", 5: "## x"}),
        ("###",),
        no_stop_trim=False,
    )
    shown = ""
    for token in (1, 2, 3, 4):
        assert not tracker.add(token)
        shown += tracker.delta()
    assert shown == "Hello world "  # the "#" may start the stop string: held back
    assert tracker.add(5) and tracker.matched == "###"
    shown += tracker.delta(finished=True)
    assert shown == tracker.final() == "Hello world "


def test_no_stop_trim_keeps_the_stop_string_and_partial_characters_wait() -> None:
    tracker = TextTracker(pieces_decoder({1: "a", 2: "\ufffd", 3: "é<end>"}), ("<end>",), True)
    tracker.add(1)
    tracker.add(2)
    assert tracker.delta() == "a"  # half a character is not shown
    assert tracker.add(3)
    assert tracker.final() == "a\ufffdé<end>"


def test_a_pushed_checkpoint_names_its_version(tmp_path: Path) -> None:
    named = tmp_path / "step-40"
    named.mkdir()
    (named / VERSION_FILE).write_text(json.dumps({"version": 12}))
    assert version_of(named, None, "3") == "12"
    assert version_of(named, "given", "3") == "given"
    assert version_of(tmp_path / "v000007", None, "3") == "7"
    assert version_of(tmp_path / "latest", None, "3") == "4"
    assert version_of(tmp_path / "latest", None, None) == "0"
    (named / VERSION_FILE).write_text("{}")
    with pytest.raises(ModelError, match="version"):
        version_of(named, None, None)


def test_top_p_and_top_k_only_sample_the_best_tokens_and_logprobs_are_tempered() -> None:
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]] * 200)
    nucleus = Sampling(temperature=1.0, top_p=0.9)
    picked = choose(logits, [nucleus] * 200, [None] * 200, [2] * 200)
    assert {c.token for c in picked} == {0, 1}
    assert {
        c.token
        for c in choose(logits[:5], [Sampling(top_k=1, temperature=1.0)] * 5, [None] * 5, [0] * 5)
    } == {0}
    hot = choose(logits[:1], [Sampling(temperature=2.0)], [None], [2])[0]
    expected = torch.log_softmax(logits[0] / 2.0, -1)
    assert hot.logprob == pytest.approx(float(expected[hot.token]))
    assert [t for _lp, t in hot.top] == [0, 1]
