"""`turnstream learn --mode rl|opd|combine`: what the worker and the trainer are started with,
and what the run counts of the teacher signal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.errors import ConfigError
from pipeline.learn.monitor import ScoredTurn
from pipeline.learn.options import LearnOptions
from pipeline.learn.run import teacher_tally
from pipeline.settings import Settings
from pipeline.training.config import load_trainer_config

runner = CliRunner()


@pytest.mark.parametrize(
    ("mode", "top_k", "baseline", "topk_coef"),
    [("rl", 0, "mean", 0.0), ("opd", 0, "none", 0.0), ("combine", 0, "mean", 0.0),
     ("opd", 3, "none", 1.0), ("combine", 2, "mean", 1.0)],
)  # fmt: skip
def test_each_mode_starts_a_trainer_its_config_accepts(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    mode: str,
    top_k: int,
    baseline: str,
    topk_coef: float,
) -> None:
    """opd takes no baseline (the trainer refuses one): its default is none; rl and
    combine centre the reward on the step's mean; top-K turns on the trainer's top-K KL;
    a teacher's gap is limited to 1 nat a token."""
    from pipeline.learn import stack

    monkeypatch.setattr(stack, "spawn_cli", lambda *args: None)
    options = LearnOptions(mode=mode, teacher_top_k=top_k)
    _proc, files = stack.start_trainer(
        Settings(), tmp_path / "model", "http://policy:1", tmp_path, options.trainer_options()
    )
    config = load_trainer_config(files.config)
    assert (config.mode, config.step_baseline, config.topk_distill_coef) == (
        mode,
        baseline,
        topk_coef,
    )
    assert config.teacher_adv_clip == (None if mode == "rl" else 1.0)
    assert config.teacher_baseline == ("none" if mode == "rl" else "mean")
    assert options.to_json()["mode"] == mode and options.to_json()["baseline"] == baseline


def test_a_mode_and_its_options_that_cannot_go_together_are_refused_with_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"mode \(--mode\) 'ppo'"):
        LearnOptions(mode="ppo")
    with pytest.raises(ConfigError, match=r"baseline \(--baseline\) mean with mode opd"):
        LearnOptions(mode="opd", baseline="mean")
    with pytest.raises(ConfigError, match=r"--teacher-top-k\) 4.*rl has no teacher"):
        LearnOptions(teacher_top_k=4)
    with pytest.raises(ConfigError, match=r"--teacher-contrast\) needs mode opd or combine"):
        LearnOptions(teacher_contrast=True)
    with pytest.raises(ConfigError, match=r"w_opd \(--w-opd\) 0.5: .*applies to mode combine"):
        LearnOptions(mode="opd", w_opd=0.5)
    with pytest.raises(ConfigError, match=r"w_opd \(--w-opd\) -1.0"):
        LearnOptions(mode="combine", w_opd=-1.0)
    assert LearnOptions(mode="opd", baseline="none").step_baseline == "none"
    assert LearnOptions(mode="combine", baseline="leave_one_out").step_baseline == "leave_one_out"


def worker_settings(
    monkeypatch: pytest.MonkeyPatch, mode: str, top_k: int = 0, contrast: bool = False
) -> Any:
    """The settings `turnstream worker` reaches with the command line and environment the
    live run starts it with (run_worker replaced: nothing starts)."""
    import pipeline.scoring.worker
    from pipeline.learn import stack

    spawned: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(stack, "spawn_cli", lambda args, env, log: spawned.append((args, env)))
    teacher = None
    if mode != "rl":
        teacher = stack.TeacherServer(
            "http://127.0.0.1:30001", Path("/models/policy"), top_k, contrast
        )
    stack.start_worker(Settings(), Path("/tmp/run"), None, mode, teacher)
    [(args, env)] = spawned
    started: list[Any] = []
    monkeypatch.setattr(
        pipeline.scoring.worker, "run_worker", lambda settings, loglevel: started.append(settings)
    )
    scoring = {k: v for k, v in env.items() if k.startswith("TURNSTREAM_SCORING_")}
    result = runner.invoke(app, args, env=scoring)
    assert result.exit_code == 0, result.output
    return started[0].scoring


def test_in_opd_the_worker_is_taught_by_the_served_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    scoring = worker_settings(monkeypatch, "opd", top_k=2)
    assert (scoring.mode, scoring.judge) == ("opd", "rules")
    assert scoring.teacher_urls == ["http://127.0.0.1:30001"]
    assert (scoring.policy_tokenizer, scoring.teacher_top_k) == (Path("/models/policy"), 2)
    rl = worker_settings(monkeypatch, "rl")
    assert (rl.mode, rl.teacher_urls) == ("rl", [])


def test_the_worker_takes_teacher_urls_on_its_command_line(
    monkeypatch: pytest.MonkeyPatch, tiny_tokenizer: Path
) -> None:
    import pipeline.scoring.worker

    started: list[Any] = []
    monkeypatch.setattr(
        pipeline.scoring.worker, "run_worker", lambda settings, loglevel: started.append(settings)
    )
    monkeypatch.setenv("TURNSTREAM_SCORING_POLICY_TOKENIZER", str(tiny_tokenizer))
    args = ["worker", "--judge", "openai", "--judge-url", "http://j:1", "--mode", "combine",
            "--teacher-url", "http://t:1", "--teacher-url", "http://t:2"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert started[0].scoring.teacher_urls == ["http://t:1", "http://t:2"]
    assert "teacher=['http://t:1', 'http://t:2']" in result.output
    refused = runner.invoke(app, args[:7])  # no teacher: an OpenAI judge serves no log-probs
    assert refused.exit_code != 0 and "TURNSTREAM_SCORING_TEACHER_URLS" in str(refused.exception)


def test_worker_and_learn_help_name_the_teacher_flags() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "worker", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert done.returncode == 0 and "--teacher-url" in done.stdout and "--judge-url" in done.stdout
    learn = runner.invoke(app, ["learn", "--help"])
    assert learn.exit_code == 0 and "--mode" in learn.output and "--teacher-top-k" in learn.output


def test_the_teacher_tally_counts_what_carried_trained_and_was_dropped() -> None:
    scored = [
        ScoredTurn("a:0", -1.0, True, 0, None, teacher=True),  # hinted, taught, trained
        ScoredTurn("b:0", -1.0, True, 0, None, teacher=True),  # taught, not trained yet
        ScoredTurn("c:0", 1.0, False, 0, "no_hint"),  # opd: no hint, dropped
        ScoredTurn("d:0", 1.0, True, 1, None),  # combine: the reward alone
        ScoredTurn("e:0", 0.0, False, 1, "no_next_state"),
        ScoredTurn("f:0", 0.0, False, 1, "hint_rejected"),  # opd: every hint flawed
    ]
    assert teacher_tally(scored, {"a:0": 1, "d:0": 1}) == {
        "samples_with_teacher": 2,
        "trained_with_teacher": 1,
        "trained_without_teacher": 1,
        "excluded_no_hint": 1,
        "excluded_hint_rejected": 1,
    }


def test_the_teacher_is_the_initial_weights_on_a_server_of_their_own_or_the_served_policy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """initial (the default): the model before learning on a second server, which no push
    reaches; policy: the served policy's own URL; rl: none."""
    from pipeline.learn import stack

    started: list[tuple[Path, str, int | None]] = []

    def fake_server(settings: Any, model: Path, workdir: Path, name: str, threads: Any,
                    rows: int | None = None) -> stack.Served:  # fmt: skip
        started.append((model, name, rows))
        return stack.Served(None, "http://127.0.0.1:30002")  # type: ignore[arg-type]

    monkeypatch.setattr(stack, "start_server", fake_server)
    model, policy = tmp_path / "initial", "http://127.0.0.1:30001"
    assert LearnOptions(mode="opd").teacher == "initial"
    teacher, served = stack.start_teacher(
        Settings(), model, tmp_path, policy, "opd", "initial", 4, 16
    )
    assert teacher == stack.TeacherServer("http://127.0.0.1:30002", model, 4)
    assert served is not None and started == [(model, "teacher", 16)]
    teacher, served = stack.start_teacher(
        Settings(), model, tmp_path, policy, "combine", "policy", 0, 16
    )
    assert (teacher, served) == (stack.TeacherServer(policy, model, 0), None)
    assert stack.start_teacher(Settings(), model, tmp_path, policy, "rl", "initial", 0, 16) == (
        None,
        None,
    )
    assert len(started) == 1
    with pytest.raises(ConfigError, match=r"teacher \(--teacher\) 'frozen'"):
        LearnOptions(mode="opd", teacher="frozen")


def test_a_contrastive_teacher_reaches_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    assert worker_settings(monkeypatch, "combine", contrast=True).teacher_contrast is True
    assert worker_settings(monkeypatch, "combine").teacher_contrast is False


def learned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> tuple[Any, Any]:
    """`turnstream learn FLAGS` up to its options, and the config its trainer would load."""
    from pipeline.cli import learn as learn_cli
    from pipeline.learn import stack

    seen: list[LearnOptions] = []
    monkeypatch.setattr(learn_cli, "run_and_report", lambda options, what: seen.append(options))
    result = runner.invoke(app, ["learn", *flags])
    assert result.exit_code == 0, result.output
    [options] = seen
    monkeypatch.setattr(stack, "spawn_cli", lambda *args: None)
    _proc, files = stack.start_trainer(
        Settings(), tmp_path / "model", "http://policy:1", tmp_path, options.trainer_options()
    )
    return options, load_trainer_config(files.config)


def test_w_opd_reaches_the_combine_trainer_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--w-opd sets the trainer's w_opd in combine (the reward's stays 1); the other modes'
    trainers keep the default and their configs say nothing of it."""
    options, config = learned(monkeypatch, tmp_path, "--mode", "combine", "--w-opd", "0.25")
    assert (config.mode, config.w_opd, config.w_rl) == ("combine", 0.25, 1.0)
    assert options.to_json()["w_opd"] == 0.25
    assert "w_opd" not in LearnOptions(mode="opd").trainer_options()
    refused = runner.invoke(app, ["learn", "--mode", "rl", "--w-opd", "0.5"])
    assert isinstance(refused.exception, ConfigError) and "--w-opd" in str(refused.exception)


def test_kl_coef_and_the_lr_schedule_reach_the_trainer_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--kl-coef sets the trainer's kl_coef in every mode, --lr-schedule and --lr-warmup its
    schedule, --entropy-coef its entropy_coef; a negative or NaN KL weight, an unknown
    schedule, an infinite entropy weight are refused with the flag named. A step of answers
    all rejected updates nothing (alike_steps skip)."""
    flags = ["--kl-coef", "0.05", "--lr-schedule", "cosine", "--lr-warmup", "2", "--steps", "8"]
    options, config = learned(monkeypatch, tmp_path, *flags, "--entropy-coef", "-0.05")
    assert (config.mode, config.kl_coef, config.kl_kind) == ("rl", 0.05, "k3")
    assert (config.lr_schedule, config.lr_warmup_steps, config.max_steps) == ("cosine", 2, 8)
    assert config.alike_steps == "skip" and config.step_baseline == "mean"
    assert config.entropy_coef == -0.05
    assert options.to_json()["kl_coef"] == 0.05
    assert LearnOptions(mode="opd", kl_coef=0.2).trainer_options()["kl_coef"] == 0.2
    for flag, bad, named in (
        ("--kl-coef", "-0.1", "kl_coef (--kl-coef)"),
        ("--kl-coef", "nan", "kl_coef (--kl-coef)"),
        ("--lr-schedule", "linear", "lr_schedule (--lr-schedule) 'linear'"),
        ("--lr-warmup", "-1", "lr_warmup (--lr-warmup) -1"),
        ("--entropy-coef", "inf", "entropy_coef (--entropy-coef) inf"),
    ):
        refused = runner.invoke(app, ["learn", flag, bad])
        assert isinstance(refused.exception, ConfigError), refused.output
        assert named in str(refused.exception)
