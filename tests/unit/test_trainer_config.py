from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.training.config import TrainerConfig, config_help, load_trainer_config
from tests.conftest import REPO


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs").glob("trainer-*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_trainer_config_loads(path: Path) -> None:
    config = load_trainer_config(path)
    assert isinstance(config, TrainerConfig)


def test_defaults_match_the_reference() -> None:
    c = TrainerConfig()
    assert (c.rollout_batch_size, c.lr, c.weight_decay, list(c.betas)) == (
        16,
        1e-5,
        0.1,
        [0.9, 0.98],
    )
    assert (c.eps_clip, c.eps_clip_high, c.w_opd, c.w_rl, c.tis_clip) == (0.2, 0.28, 1.0, 1.0, 2.0)
    assert (c.kl_coef, c.entropy_coef) == (0.0, 0.0)


def test_metrics_host_and_retention_options(tmp_path: Path) -> None:
    default = TrainerConfig()
    assert default.metrics_host == "127.0.0.1"
    assert (default.keep_checkpoints, default.keep_weight_versions) == (2, 2)
    path = tmp_path / "t.yaml"
    path.write_text("metrics_host: 0.0.0.0\nmetrics_port: 6067\nkeep_checkpoints: 1\n")
    config = load_trainer_config(path)
    assert (config.metrics_host, config.metrics_port, config.keep_checkpoints) == (
        "0.0.0.0",
        6067,
        1,
    )


def test_every_option_has_help() -> None:
    text = config_help()
    assert len(text.splitlines()) == len(TrainerConfig.__dataclass_fields__)
    assert all(len(line.split(None, 2)) == 3 for line in text.splitlines())


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("lr: fast\n", "option lr"),
        ("learning_rate: 1e-5\n", "unknown option(s) ['learning_rate']"),
        ("eps_clp: 0.1\n", "unknown option(s) ['eps_clp'] (eps_clp: did you mean eps_clip"),
        ("lr: fast\nsed: 1\n", "unknown option(s) ['sed'] (sed: did you mean seed?)"),
        ("zero_stage: 5\n", "zero_stage must be 0..3"),
        ("keep_checkpoints: 0\n", "keep_checkpoints must be >= 1, got 0"),
        ("keep_weight_versions: -1\n", "keep_weight_versions must be >= 1, got -1"),
        ("- a\n", "expected a mapping"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_trainer_config(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_zero3_weight_push_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("zero_stage: 3\nupdate_weights_interval: 1\n")
    with pytest.raises(ConfigError, match="ZeRO-3 is not supported yet"):
        load_trainer_config(path)


def test_loss_aggregation_defaults_to_the_references_and_help_says_so() -> None:
    assert TrainerConfig().loss_agg == "seq_mean_token_mean"
    [line] = [x for x in config_help().splitlines() if x.startswith("loss_agg ")]
    assert "'seq_mean_token_mean'" in line and "slime" in line and "token_mean" in line
    assert TrainerConfig(loss_agg="token_mean").loss_agg == "token_mean"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("mode: rl\ntopk_distill_coef: 0.5\n", "topk_distill_coef needs a teacher"),
        ("tis_clip: 0.5\n", "tis_clip must be >= 1"),
        ("loss_agg: sum\n", "option loss_agg"),
        ("step_baseline: mean\ngroup_advantage: mean\n", "set one of them"),
        ("mode: opd\nstep_baseline: mean\n", "step_baseline applies to the rl reward"),
        ("step_baseline: median\n", "option step_baseline"),
    ],
)
def test_loss_options_are_checked(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_trainer_config(path)


def test_a_config_without_a_model_trains_with_a_tiny_tokenizer_made_once(tmp_path: Path) -> None:
    from pipeline.training.run import load_tokenizer

    config = TrainerConfig(checkpoint_dir=str(tmp_path / "run" / "checkpoints"))
    tokenizer = load_tokenizer(config)
    made = tmp_path / "run" / "tokenizer" / "tokenizer.json"
    assert made.exists() and tokenizer.eos_token == "<|im_end|>"
    written = made.stat().st_mtime_ns
    assert len(load_tokenizer(config)) == len(tokenizer)  # the next start loads it again
    assert made.stat().st_mtime_ns == written
