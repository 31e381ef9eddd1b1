"""The prompt set: questions with a known short answer, and the rule that checks an answer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.learn.prompts import Prompt, default_prompts, is_correct, load_prompts, split

ROOT = Path(__file__).resolve().parents[2]


def ask(answer: str, *aliases: str) -> Prompt:
    return Prompt("q", "train", "?", answer, aliases)


def test_an_answer_is_correct_when_it_holds_the_answer_as_a_whole_word() -> None:
    seven = ask("7", "seven")
    assert is_correct("7", seven) and is_correct("It is 7.", seven)
    assert not is_correct("17", seven) and not is_correct("It is 70", seven)
    assert not is_correct("7th", seven) and not is_correct("x7", seven)
    assert is_correct("Seven.", seven) and is_correct("SEVEN days", seven)  # aliases, any case
    assert not is_correct("seventeen", seven)
    paris = ask("Paris")
    assert is_correct("Paris.", paris) and is_correct("paris", paris)
    assert is_correct("The capital of France is Paris!", paris)
    assert not is_correct("Parisian food", paris) and not is_correct("", paris)
    assert not is_correct(None, paris)


def test_multi_word_answers_match_only_as_the_whole_phrase() -> None:
    city = ask("New Delhi", "Delhi")
    assert is_correct("It is new delhi.", city) and is_correct("Delhi", city)
    assert not is_correct("New Delhite", ask("New Delhi"))
    assert not is_correct("New York", ask("New Delhi"))
    assert is_correct("Twenty-three.", ask("23", "twenty-three"))
    assert not is_correct("twenty", ask("23", "twenty-three"))
    assert is_correct("It's -3", ask("-3")) and not is_correct("It's 3", ask("-3"))


def test_the_shipped_prompt_set_has_answers_in_every_family_and_both_splits() -> None:
    prompts = load_prompts(default_prompts())
    train, heldout = split(prompts, "train"), split(prompts, "heldout")
    assert len(train) >= 200 and len(heldout) >= 80
    assert not {p.text for p in train} & {p.text for p in heldout}
    assert len({p.id for p in prompts}) == len(prompts)
    families = {"capital", "arithmetic", "opposite", "plural", "count", "colour", "fact"}
    for name in ("train", "heldout"):
        assert {p.id.split("-")[0] for p in prompts if p.split == name} == families
    for p in prompts:
        assert is_correct(p.answer, p) and all(is_correct(a, p) for a in p.aliases)
        assert not is_correct(p.text, p), p  # the question does not give its answer away
    assert is_correct("seven", next(p for p in prompts if p.answer == "7"))


def test_the_shipped_prompt_set_is_what_its_generator_writes(tmp_path: Path) -> None:
    out = tmp_path / "prompts.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "make_prompts.py"), "--out", str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_bytes() == (ROOT / "examples" / "prompts.jsonl").read_bytes()


def test_a_line_without_an_answer_names_the_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    good = '{"id": "a", "split": "train", "prompt": "2 + 2?", "answer": "4", "aliases": ["four"]}'
    path.write_text(good + '\n{"id": "b", "split": "train", "prompt": "hi", "aliases": []}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: missing answer"):
        load_prompts(path)
    path.write_text('{"id": "b", "split": "train", "prompt": "hi", "answer": "x"}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:1: missing aliases"):
        load_prompts(path)
    path.write_text(
        '{"id": "b", "split": "train", "prompt": "hi", "answer": "x", "aliases": "y"}\n'
    )
    with pytest.raises(ConfigError, match=r"p\.jsonl:1: aliases must be a list"):
        load_prompts(path)
    path.write_text('{"id": "b", "split": "train", "prompt": "hi", "answer": " ", "aliases": []}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:1: answer must be a non-empty"):
        load_prompts(path)
    path.write_text(good + "\n")
    assert load_prompts(path) == [Prompt("a", "train", "2 + 2?", "4", ("four",))]
