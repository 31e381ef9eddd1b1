"""The simulated users' preference, the replies the judge reads, the prompt set, evaluation."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.errors import ConfigError
from pipeline.judge.rules import RulesJudge
from pipeline.learn.evaluate import Answer, is_degenerate, measure_answer, summarize
from pipeline.learn.preference import (
    CORRECTIONS,
    SHORTER,
    THANKS,
    RightAndShort,
    word_count,
)
from pipeline.learn.prompts import Prompt, default_prompts, load_prompts, split
from pipeline.learn.users import served_version

PARIS = Prompt("capital-france", "train", "What is the capital of France?", "Paris")


def test_right_and_short_is_met_only_by_a_right_answer_that_ends_by_itself_within_the_limit() -> (
    None
):
    users = RightAndShort(max_words=5)
    assert users.verdict("Paris is the capital.", "stop", PARIS) == "right"
    assert users.verdict("It is paris, in France", "stop", PARIS) == "right"  # five words
    assert users.verdict("It is Paris, in France, surely", "stop", PARIS) == "long"
    assert users.verdict("Paris.", "length", PARIS) == "long"  # cut at max_tokens
    assert users.verdict("Lyon.", "stop", PARIS) == "wrong"
    assert users.verdict("Lyon, no doubt about it at all", "length", PARIS) == "wrong"
    assert users.verdict("Parisian.", "stop", PARIS) == "wrong"
    assert (
        users.verdict("", "stop", PARIS) == "wrong"
        and users.verdict(None, "stop", PARIS) == "wrong"
    )
    assert users.met("Paris.", "stop", PARIS) and not users.met("Paris.", "length", PARIS)
    assert word_count("  a\nb\tc  ") == 3


def test_each_kind_of_reply_has_several_phrasings_chosen_by_the_seeded_rng() -> None:
    users = RightAndShort(max_words=7)
    for verdict, phrasings in (("right", THANKS), ("wrong", CORRECTIONS), ("long", SHORTER)):
        assert len(set(phrasings)) >= 4
        seen = {users.reply(verdict, PARIS, random.Random(seed)) for seed in range(200)}
        assert len(seen) == len(phrasings), verdict  # every phrasing is used
    replies = [users.reply("wrong", PARIS, random.Random(3)) for _ in range(2)]
    assert replies[0] == replies[1]  # the same seed, the same words
    assert all("Paris" in users.reply("wrong", PARIS, random.Random(s)) for s in range(50))
    assert "{" not in "".join(users.reply("long", PARIS, random.Random(s)) for s in range(50))


def test_the_rules_judge_scores_every_phrasing_as_the_user_meant_it() -> None:
    """Thanks +1, a correction and a request to be shorter -1, never 0 (which would exclude
    the sample): each phrasing, with each shipped prompt's answer filled in."""
    users = RightAndShort()
    for phrasing in THANKS:
        assert RulesJudge.vote("user", phrasing) == 1, phrasing
    for prompt in load_prompts(default_prompts()):
        for phrasing in (*CORRECTIONS, *SHORTER):
            reply = phrasing.format(answer=prompt.answer, max_words=users.max_words)
            assert RulesJudge.vote("user", reply) == -1, reply


def test_a_bad_prompt_line_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rest = '"prompt": "hi", "answer": "hello", "aliases": []'
    path.write_text(f'{{"id": "a", "split": "train", {rest}}}\n{{"id": "b", "split": "x"}}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: missing prompt, answer, aliases"):
        load_prompts(path)
    path.write_text("[1]\n")
    with pytest.raises(ConfigError, match=r"p\.jsonl:1: expected an object"):
        load_prompts(path)
    path.write_text(f'{{"id": "a", "split": "test", {rest}}}\n')
    with pytest.raises(ConfigError, match=r"p\.jsonl:1: split must be one of"):
        load_prompts(path)
    path.write_text(f'{{"id": "a", "split": "train", {rest}}}\n')
    with pytest.raises(ConfigError, match="no 'heldout' prompts"):
        split(load_prompts(path), "heldout")


def test_the_served_version_comes_from_the_servers_metadata() -> None:
    assert served_version(SimpleNamespace(model_extra={"metadata": {"weight_version": "3"}})) == 3
    assert (
        served_version(SimpleNamespace(model_extra={"metadata": {"weight_version": "x"}})) is None
    )
    assert served_version(SimpleNamespace(model_extra={})) is None
    assert served_version(SimpleNamespace(metadata={"weight_version": "2"})) == 2


def test_an_answer_is_degenerate_when_empty_or_one_word_that_is_not_the_answer() -> None:
    assert is_degenerate("", PARIS) and is_degenerate(None, PARIS) and is_degenerate(" \n", PARIS)
    assert is_degenerate("Yes.", PARIS) and is_degenerate("Lyon", PARIS)
    assert not is_degenerate("Paris.", PARIS)  # one word, and the answer
    assert not is_degenerate("Lyon, I think", PARIS)  # wrong, but an answer
    delhi = Prompt("d", "heldout", "Capital of India?", "New Delhi", ("Delhi",))
    assert not is_degenerate("Delhi", delhi) and is_degenerate("New", delhi)


def test_each_answer_is_measured_on_success_accuracy_length_and_degeneracy() -> None:
    users = RightAndShort(max_words=3)
    short = measure_answer(PARIS, "Paris.", "stop", 2, users)
    assert (short.met, short.correct, short.degenerate, short.words) == (True, True, False, 1)
    long = measure_answer(PARIS, "It is Paris, of course.", "stop", 2, users)
    assert (long.met, long.correct, long.degenerate, long.words) == (False, True, False, 5)
    cut = measure_answer(PARIS, "Paris", "length", 2, users)
    assert (cut.met, cut.correct, cut.stopped) == (False, True, False)
    empty = measure_answer(PARIS, "", "stop", None, users)
    assert (empty.met, empty.correct, empty.degenerate, empty.version) == (False, False, True, None)


def test_evaluation_success_accuracy_length_degenerate_and_versions() -> None:
    answers = [
        Answer("a", 4, True, 0, True, correct=True),
        Answer("b", 40, False, 0, False, correct=True),
        Answer("c", 1, False, 1, True, correct=False, degenerate=True),
        Answer("d", 31, False, None, True),
        Answer("e", 0, False, 1, True, degenerate=True),
    ]
    result = summarize("after", answers)
    assert (result.n, result.met, result.correct, result.degenerate) == (5, 1, 2, 2)
    assert result.success == 0.2 and result.accuracy == 0.4 and result.degenerate_share == 0.4
    assert result.mean_words == pytest.approx(15.2)
    assert result.versions == {"0": 2, "1": 2, "unknown": 1}
    assert result.to_json() == {
        "label": "after", "n": 5, "success": 0.2, "accuracy": 0.4, "mean_words": 15.2,
        "degenerate": 0.4, "versions": {"0": 2, "1": 2, "unknown": 1},
    }  # fmt: skip
    empty = summarize("empty", [])
    assert (empty.success, empty.accuracy, empty.degenerate_share) == (0.0, 0.0, 0.0)


async def test_users_never_start_more_sessions_than_allowed() -> None:
    """The limit holds from the first session on, before anyone watches the turns: a user
    takes its place before it asks, so sessions cannot slip past a limit set late."""
    from aiohttp.test_utils import TestServer

    from pipeline.learn.users import Population, Sampling
    from pipeline.testing.policy_sim import PolicySimConfig, PolicySimulator

    class Watched(Population):
        """Notes each user (its task) that the limit held back, for the end marker."""

        held_back: set[asyncio.Task[Any] | None]

        @property
        def paused(self) -> bool:
            paused = Population.paused.fget(self)  # type: ignore[attr-defined]
            if paused:
                self.held_back.add(asyncio.current_task())
            return paused

    async def every_user_held_back() -> None:
        """The end marker: each of the five users has come to the limit again since now and
        been held there, so none is in a session it might have slipped past the limit."""
        population.held_back.clear()
        await wait_for(lambda: len(population.held_back) == 5)

    server = TestServer(PolicySimulator(PolicySimConfig(latency_ms=50)).app(), host="127.0.0.1")
    await server.start_server()
    prompts = [
        Prompt("p0", "train", "Say hi.", "hi"),
        Prompt("p1", "train", "Name a colour.", "red", ("blue",)),
    ]
    population = Watched(
        str(server.make_url("")).rstrip("/"), prompts, RightAndShort(), Sampling(), 5, "t"
    )
    population.held_back = set()
    population.allowed = 3
    runner = asyncio.ensure_future(population.run())
    try:
        await wait_for(lambda: len(population.turns) >= 3)
        await every_user_held_back()
        assert (population.started, len(population.turns)) == (3, 3)
        assert population.paused
        population.allowed = 5
        await wait_for(lambda: len(population.turns) >= 5)
        await every_user_held_back()
        assert (population.started, len(population.turns)) == (5, 5)
    finally:
        population.stopping = True
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await server.close()


async def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_sessions_started_in_a_group_ask_one_prompt_and_alone_each_user_its_own() -> None:
    from pipeline.learn.users import Population, Sampling

    prompts = [Prompt(f"p{i}", "train", f"Q{i}?", "a") for i in range(50)]

    def population(group_size: int, seed: int = 3) -> Population:
        return Population("http://unused", prompts, RightAndShort(), Sampling(), 16, "t", seed,
                          group_size=group_size)  # fmt: skip

    grouped = population(4)
    picks = [grouped._prompt(random.Random(k), index).id for k, index in enumerate(range(16))]
    groups = [picks[i : i + 4] for i in range(0, 16, 4)]
    assert all(len(set(g)) == 1 for g in groups)  # whichever user starts it
    assert len({g[0] for g in groups}) > 1  # the groups differ
    assert picks == [population(4)._prompt(random.Random(99), i).id for i in range(16)]
    assert picks != [population(4, seed=4)._prompt(random.Random(0), i).id for i in range(16)]
    alone = population(1)
    own = [alone._prompt(random.Random(k), 0).id for k in range(16)]
    assert own == [random.Random(k).choice(prompts).id for k in range(16)]


def test_a_group_size_must_divide_the_batch_and_needs_a_baseline() -> None:
    from pipeline.learn.options import LearnOptions

    assert LearnOptions(group_size=4).trainer_options()["baseline_group"] == "prompt"
    assert LearnOptions().trainer_options()["baseline_group"] == "step"
    with pytest.raises(ConfigError, match=r"group_size \(--group-size\) 3: give a divisor"):
        LearnOptions(group_size=3)
    with pytest.raises(ConfigError, match=r"group_size .* has no baseline"):
        LearnOptions(group_size=4, mode="opd")
    with pytest.raises(ConfigError, match="give a divisor"):
        LearnOptions(group_size=0)


def test_held_back_users_with_nothing_moving_stop_the_run_with_the_reason() -> None:
    from pipeline.errors import TurnstreamError
    from pipeline.learn.loop import Stall

    now = [0.0]
    stall = Stall(limit_s=300, clock=lambda: now[0])
    progress = (8, 0, 8, 0)  # turns, settled, scored, steps
    for t in (0, 100, 299):
        now[0] = t
        stall.check(True, progress, waiting=3)
    now[0] = 400
    stall.check(False, progress, waiting=3)  # not held back: waiting is the trainer's pace
    now[0] = 650
    stall.check(True, progress, waiting=3)
    now[0] = 700
    stall.check(True, (9, 1, 9, 1), waiting=3)  # something moved: the clock starts again
    now[0] = 999
    stall.check(True, (9, 1, 9, 1), waiting=3)
    now[0] = 1001
    with pytest.raises(TurnstreamError, match=r"waited 301s .* 3 served turn\(s\) .*not_recorded"):
        stall.check(True, (9, 1, 9, 1), waiting=3)


def test_users_held_closer_than_a_batch_would_wait_forever_and_are_refused() -> None:
    from pipeline.learn.options import LearnOptions

    with pytest.raises(ConfigError, match="max_ahead 4 is below the batch size 8"):
        LearnOptions(batch_size=8, max_ahead=4)
    assert LearnOptions(batch_size=8, max_ahead=8).max_ahead == 8
    assert LearnOptions(batch_size=8, max_ahead=None).max_ahead is None
    defaults = LearnOptions()
    assert defaults.max_ahead is not None and defaults.max_ahead >= defaults.batch_size


def test_each_push_is_handed_to_on_push_while_no_user_may_start_a_session() -> None:
    """The loop sees pushes 1 and 2 together, then 3; each is handed over in order, with
    the users held (allowed == started) meanwhile and their limit given back after."""
    import io

    from rich.console import Console

    from pipeline.learn.freshness import Push
    from pipeline.learn.loop import Watched, follow

    population = SimpleNamespace(allowed=None, started=7, paused=False, failures=0)
    users = SimpleNamespace(turns=[], error=None, population=population, rate=lambda: 0.0)
    arriving = [[Push(1, 1, 1.0), Push(2, 2, 2.0)], [], [Push(3, 3, 3.0)]]

    class Monitor:
        def __init__(self) -> None:
            self.scored: dict[str, Any] = {}
            self.trained: set[str] = set()
            self.steps: list[dict[str, Any]] = []
            self.pushes = [Push(0, 0, 0.0)]  # before the loop: not handed over
            self.polls = 0

        def poll(self) -> None:
            self.pushes = [*self.pushes, *(arriving[self.polls] if self.polls < 3 else [])]
            self.polls += 1

    seen: list[tuple[int, int | None]] = []
    monitor = Monitor()
    follow(
        "learning", users, monitor, Watched(), lambda: monitor.polls >= 4,  # type: ignore[arg-type]
        Console(file=io.StringIO()), 0.0, 3, None, float("inf"),
        lambda version: seen.append((version, population.allowed)),
    )  # fmt: skip
    assert seen == [(1, 7), (2, 7), (3, 7)]
    assert population.allowed is None  # no limit again, as before


def test_every_fourth_version_before_the_last_is_evaluated() -> None:
    from pipeline.learn.options import LearnOptions
    from pipeline.learn.run import LearnRun

    evaluated: list[str] = []
    run = SimpleNamespace(
        options=LearnOptions(steps=16, eval_every=4),
        report=SimpleNamespace(evaluation={}),
        _periodic_s=0.0,
        _evaluation=lambda label: evaluated.append(label) or summarize(label, []),
    )
    for version in range(1, 17):
        LearnRun._evaluate_pushed(run, version)  # type: ignore[arg-type]
    assert evaluated == ["version 4", "version 8", "version 12"]  # 16 is "after"
    assert list(run.report.evaluation["periodic"]) == ["4", "8", "12"]
    assert run.report.evaluation["periodic"]["8"]["success"] == 0.0
    run.options = LearnOptions(steps=16, eval_every=0)
    LearnRun._evaluate_pushed(run, 4)  # type: ignore[arg-type]
    assert len(evaluated) == 3


def test_a_negative_eval_every_is_refused_with_its_flag() -> None:
    from pipeline.learn.options import LearnOptions

    with pytest.raises(ConfigError, match=r"--eval-every\) is -4"):
        LearnOptions(eval_every=-4)
    assert LearnOptions(eval_every=0).eval_every == 0


def test_a_push_settles_its_steps_samples_before_the_trainers_ledger_lists_them() -> None:
    """Ten served turns, batch 4: one excluded, two in the ledger. Counted by the ledger, 3
    are settled; once step 2 is pushed, 8 samples are trained (2 x 4) whichever the ledger
    lists yet, and never more than the turns not excluded."""
    from pipeline.learn.loop import settled
    from pipeline.learn.monitor import ScoredTurn
    from pipeline.learn.users import ServedTurn

    turns = [ServedTurn(f"s{i}", "p", 0, 3, True, 0.0) for i in range(10)]
    scored = {f"s{i}:0": ScoredTurn(f"s{i}:0", 1.0, True, 0) for i in range(10)}
    scored["s9:0"] = ScoredTurn("s9:0", 0.0, False, 0, "no_next_state")
    monitor: Any = SimpleNamespace(scored=scored, trained={"s0:0": 1, "s1:0": 1}, pushed_step=0)
    assert settled(turns, monitor) == 3
    assert settled(turns, monitor, batch_size=4) == 3  # no push yet
    monitor.pushed_step = 2
    assert settled(turns, monitor) == 3  # the ledger alone: the checkpoint is not written yet
    assert settled(turns, monitor, batch_size=4) == 9  # 8 trained + 1 excluded
    monitor.pushed_step = 5
    assert settled(turns, monitor, batch_size=4) == 10  # capped at the turns there are
    assert settled(turns[:2], monitor, batch_size=4) == 2
