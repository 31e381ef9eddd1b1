"""Reward types, the sync/async runner, the decorators, class-path loading and the PRM adapter."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from pipeline.errors import RewardError
from pipeline.events import ChatMessage, NextState, Paired, Response, Turn
from pipeline.judge.client import JudgeUnavailable
from pipeline.judge.rules import RulesJudge
from pipeline.judge.votes import EvalResult
from pipeline.rewards import (
    AgentOutput,
    Reward,
    RewardInput,
    RewardOutput,
    RewardProcessor,
    TaskStatus,
    aggregate_func,
    load_class,
    load_processor,
    response_text,
    reward_func,
    reward_input_from_paired,
    run_processor,
    setup_processor,
    sub_reward_func,
)
from pipeline.rewards.prm import PrmJudge
from pipeline.settings import ScoringSettings, Settings
from pipeline.testing.judge_sim import JudgeSimulator, SimConfig


def turn_input(response: str = "done", next_role: str = "user", next_content: str = "thanks"):  # type: ignore[no-untyped-def]
    return RewardInput(
        response=Response(content=response),
        next_state=NextState(role=next_role, content=next_content),  # type: ignore[arg-type]
    )


def test_failed_needs_an_error_and_success_needs_a_reward() -> None:
    with pytest.raises(ValidationError, match="must set error"):
        RewardOutput(status=TaskStatus.FAILED)
    with pytest.raises(ValidationError, match="must carry a reward"):
        RewardOutput(status=TaskStatus.SUCCESS)
    with pytest.raises(ValidationError, match="finite"):
        RewardOutput.success(float("nan"))
    zero = RewardOutput.success(0.0)
    assert zero.ok and zero.score == 0.0  # a 0 is a valid signal, not a failure
    failed = RewardOutput.failed("judge timed out")
    assert not failed.ok and failed.error == "judge timed out"
    with pytest.raises(ValueError, match="no score"):
        _ = failed.score


def test_reward_input_rejects_misspelt_fields() -> None:
    with pytest.raises(ValidationError, match="agent_outputs"):
        RewardInput.model_validate({"agent_outputs": [{"messages": []}]})
    parsed = RewardInput.model_validate_json(
        '{"func_type": "reward", "ground_truth": 3, '
        '"next_state": {"role": "tool", "content": "ok"}}'
    )
    assert parsed.ground_truth == 3 and parsed.next_state is not None


def test_reward_input_from_a_paired_turn_keeps_prompt_response_next_state_and_ids() -> None:
    turn = Turn(
        type="turn",
        session_id="s1",
        turn_index=4,
        turn_type="main",
        ts=1.0,
        messages=[ChatMessage(role="user", content="List the files.")],
        response=Response(
            content=None, tool_calls=[{"function": {"name": "ls", "arguments": "{}"}}]
        ),
        policy_version=7,
    )
    paired = Paired(
        sample_id="s1:4",
        turn=turn,
        next_state=NextState(role="tool", content="a.txt"),
        first_judged=True,
        paired_ts=2.0,
        attempt=2,
    )
    got = reward_input_from_paired(paired)
    assert got.agent_output.messages == [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "ls", "arguments": "{}"}}],
        },
    ]
    assert got.next_state == paired.next_state and got.response == turn.response
    assert got.request_metadata == {
        "sample_id": "s1:4",
        "session_id": "s1",
        "turn_index": 4,
        "policy_version": 7,
        "attempt": 2,
        "group_id": None,
    }
    assert response_text(got) == "[tool call] ls({})"


def test_response_text_falls_back_to_the_last_assistant_message() -> None:
    messages = [
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": [{"type": "text", "text": "second"}]},
    ]
    got = response_text(RewardInput(agent_output=AgentOutput(messages=messages)))
    assert "second" in got and "first" not in got
    assert response_text(RewardInput()) == ""


class SyncScore:
    def setup(self) -> None:
        self.ready = True

    def process(self, input: RewardInput) -> RewardOutput:
        return RewardOutput.success(len(response_text(input)))


class AsyncScore:
    def setup(self) -> None:
        pass

    async def process(self, input: RewardInput) -> RewardOutput:
        await asyncio.sleep(0)
        return RewardOutput.success(-1.0, {"slept": 1.0})


async def test_run_processor_awaits_async_and_calls_sync() -> None:
    sync, asyn = SyncScore(), AsyncScore()
    assert isinstance(sync, RewardProcessor) and isinstance(asyn, RewardProcessor)
    setup_processor(sync)
    assert sync.ready
    assert (await run_processor(sync, turn_input("abcd"))).score == 4.0
    assert (await run_processor(asyn, turn_input())).score == -1.0


async def test_run_processor_rejects_a_wrong_return_type() -> None:
    class Bad:
        def setup(self) -> None:
            pass

        def process(self, input: RewardInput) -> float:
            return 1.0

    with pytest.raises(RewardError, match="returned float, expected a RewardOutput"):
        await run_processor(Bad(), RewardInput())  # type: ignore[arg-type]


def test_an_async_setup_is_refused_with_a_reason() -> None:
    class AsyncSetup:
        async def setup(self) -> None:
            pass

    with pytest.raises(RewardError, match="must be a plain def"):
        setup_processor(AsyncSetup())


@reward_func("Shape")
class Shape:
    """Two dimensions, default aggregation (no @aggregate_func)."""

    @sub_reward_func("length", sub_weight=2.0)
    def length(self, input: RewardInput) -> RewardOutput:
        return RewardOutput.success(0.25, {"chars": float(len(response_text(input)))})

    @sub_reward_func("polite", sub_weight=0.5)
    async def polite(self, input: RewardInput) -> RewardOutput:
        return RewardOutput.success(1.0 if "please" in response_text(input) else 0.0)


async def test_default_aggregate_is_the_weighted_sum_of_sub_scores() -> None:
    out = await run_processor(Shape(), turn_input("please wait"))
    # 2.0 * 0.25 + 0.5 * 1.0 = 1.0 (weights are not normalised)
    assert out.score == pytest.approx(1.0)
    assert out.reward is not None
    assert out.reward.reward_metrics == {"length": 0.25, "length/chars": 11.0, "polite": 1.0}
    setup_processor(Shape())  # a no-op setup() is provided


async def test_a_failed_sub_reward_fails_the_processor_without_aggregating() -> None:
    aggregated = []

    @reward_func("Flaky")
    class Flaky:
        @sub_reward_func("rule", sub_weight=0.5)
        def rule(self, input: RewardInput) -> RewardOutput:
            return RewardOutput.success(1.0)

        @sub_reward_func("judge", sub_weight=0.5)
        async def judge(self, input: RewardInput) -> RewardOutput:
            return RewardOutput.failed("judge timed out")

        @aggregate_func
        def aggregate(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
            aggregated.append(sub_rewards)
            return RewardOutput.success(1.0)

    out = await run_processor(Flaky(), RewardInput())
    assert out.status is TaskStatus.FAILED
    assert out.error == "sub-reward failed: judge: judge timed out"
    assert aggregated == []


async def test_sync_aggregate_and_sub_rewards_run_concurrently() -> None:
    both_running = asyncio.Barrier(2)  # passed only once a and b are in flight together

    @reward_func
    class Slow:
        @sub_reward_func("a")
        async def a(self, input: RewardInput) -> RewardOutput:
            await both_running.wait()
            return RewardOutput.success(1.0)

        @sub_reward_func("b")
        async def b(self, input: RewardInput) -> RewardOutput:
            await both_running.wait()
            return RewardOutput.success(3.0)

        @aggregate_func
        def mean(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput:
            scores = self.get_scores(sub_rewards)
            return RewardOutput.success(sum(scores.values()) / len(scores))

    # one after the other, a would wait for b for ever: the timeout only ends such a run
    out = await asyncio.wait_for(run_processor(Slow(), RewardInput()), timeout=30)
    assert out.score == 2.0
    assert Slow.__reward_name__ == "Slow"  # type: ignore[attr-defined]


def test_decorator_misuse_is_refused() -> None:
    with pytest.raises(TypeError, match="used twice: x"):

        @reward_func("Twice")
        class Twice:
            @sub_reward_func("x")
            def a(self, input: RewardInput) -> RewardOutput: ...

            @sub_reward_func("x")
            def b(self, input: RewardInput) -> RewardOutput: ...

    with pytest.raises(TypeError, match="remove its own process"):

        @reward_func("Both")
        class Both:
            @sub_reward_func("x")
            def a(self, input: RewardInput) -> RewardOutput: ...

            def process(self, input: RewardInput) -> RewardOutput: ...

    with pytest.raises(TypeError, match="without any @sub_reward_func"):

        @reward_func("Lonely")
        class Lonely:
            @aggregate_func
            def agg(self, sub_rewards: dict[str, RewardOutput]) -> RewardOutput: ...

    with pytest.raises(ValueError, match="finite"):
        sub_reward_func("x", sub_weight=float("inf"))


async def test_a_sub_reward_returning_the_wrong_type_names_itself() -> None:
    @reward_func("Sloppy")
    class Sloppy:
        @sub_reward_func("raw")
        def raw(self, input: RewardInput) -> Reward:
            return Reward(reward_score=1.0)

    with pytest.raises(RewardError, match=r"Sloppy.raw \(sub-reward 'raw'\) returned Reward"):
        await run_processor(Sloppy(), RewardInput())


def test_a_file_path_may_import_modules_of_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shared_rules").mkdir()
    (tmp_path / "shared_rules" / "base.py").write_text("class Rule:\n    pass\n")
    (tmp_path / "entry.py").write_text("from shared_rules.base import Rule\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert load_class("entry.py:Rule").__module__ == "shared_rules.base"
    finally:
        for name in [
            n for n in sys.modules if n.startswith(("shared_rules", "_turnstream_reward_entry"))
        ]:
            del sys.modules[name]


def test_class_paths_load_from_modules_and_files_with_clear_errors(tmp_path: Path) -> None:
    assert load_class("examples.rewards.refusal:SafetyProcessor").__name__ == "SafetyProcessor"
    source = tmp_path / "my_reward.py"
    source.write_text(
        "from pipeline.rewards import RewardOutput\n"
        "class Const:\n"
        "    def __init__(self, value=1.0):\n"
        "        self.value = value\n"
        "    def setup(self): pass\n"
        "    def process(self, input): return RewardOutput.success(self.value)\n"
    )
    built = load_processor(f"{source}:Const", {"value": 0.25})
    assert built.value == 0.25
    assert load_class("examples.rewards.refusal.SafetyProcessor").__name__ == "SafetyProcessor"
    with pytest.raises(RewardError, match="is not a class path"):
        load_class("examples.rewards.refusal")
    with pytest.raises(RewardError, match="no module named 'no_such_pkg'"):
        load_class("no_such_pkg.rewards:X")
    with pytest.raises(RewardError, match="has no attribute 'Nope'"):
        load_class("examples.rewards.refusal:Nope")
    with pytest.raises(RewardError, match="no such file"):
        load_class(f"{tmp_path}/missing.py:X")
    with pytest.raises(RewardError, match="cannot be built with colour"):
        load_processor(f"{source}:Const", {"colour": "red"})
    with pytest.raises(RewardError, match="not a reward processor"):
        load_processor("pathlib:PurePath")


class FakeJudge:
    identity = RulesJudge.identity

    def __init__(self, result: EvalResult | Exception) -> None:
        self.result = result
        self.calls: list[tuple[str, str, str]] = []

    async def eval(self, response_text: str, next_role: str, next_content: str) -> EvalResult:
        self.calls.append((response_text, next_role, next_content))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_prm_judge_scores_the_majority_and_fails_when_unreachable() -> None:
    judge = FakeJudge(EvalResult(-1.0, [-1, -1, None], 3, 0.1))
    out = await run_processor(PrmJudge(judge), turn_input("Done.", "user", "That's wrong."))  # type: ignore[arg-type]
    assert out.score == -1.0
    assert out.reward is not None and out.reward.reward_metrics["failed_votes"] == 1.0
    assert judge.calls == [("Done.", "user", "That's wrong.")]

    down = FakeJudge(JudgeUnavailable("judge unreachable after 4 attempts: refused"))
    out = await run_processor(PrmJudge(down), turn_input())  # type: ignore[arg-type]
    assert out.status is TaskStatus.FAILED and "unreachable" in (out.error or "")

    no_next = FakeJudge(EvalResult(1.0, [1], 1, 0.0))
    out = await run_processor(PrmJudge(no_next), RewardInput(response=Response(content="x")))  # type: ignore[arg-type]
    assert out.ok and out.score == 0.0 and no_next.calls == []


async def test_prm_judge_from_settings_speaks_to_the_configured_judge() -> None:
    sim = JudgeSimulator(SimConfig(agreement=1.0, vote_dist={-1: 1.0}))
    server = TestServer(sim.app(), host="127.0.0.1")
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        settings = Settings(scoring=ScoringSettings(judge="sglang", judge_urls=[url], m=3))
        prm = PrmJudge(settings=settings)
        setup_processor(prm)
        assert prm.describe().startswith("prm: sglang judge")
        out = await run_processor(prm, turn_input("Deployed.", "user", "No, the other server."))
        assert out.score == -1.0 and sim.stats.calls == 3
        await prm.close()
    finally:
        await server.close()

    refused = Settings(
        scoring=ScoringSettings(
            judge="openai", judge_urls=["http://127.0.0.1:9"], judge_max_attempts=1
        )
    )
    prm = PrmJudge(settings=refused)
    setup_processor(prm)
    out = await run_processor(prm, turn_input())
    assert out.status is TaskStatus.FAILED and "unreachable after 1 attempts" in (out.error or "")
    await prm.close()
