from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import TopicPlanError
from pipeline.settings import Settings
from pipeline.topics import REQUIRED_TOPICS, admin
from tests.conftest import REPO
from tests.kafka.helpers import turnstream


def test_apply_creates_every_topic_then_changes_nothing(settings: Settings) -> None:
    first = admin.apply(settings)
    assert sorted(c.topic for c in first if c.kind == "create") == sorted(
        s.name for s in settings.topics
    )
    assert admin.plan(settings) == []
    assert admin.apply(settings) == []


def _edited(settings: Settings, tmp_path: Path, edit) -> Settings:  # type: ignore[no-untyped-def]
    data = yaml.safe_load((REPO / "topics.yaml").read_text())
    edit(data["topics"])
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(data))
    return settings.model_copy(update={"topics_file": path})


def test_apply_grows_partitions_and_alters_configs(settings: Settings, tmp_path: Path) -> None:
    admin.apply(settings)

    def edit(topics: dict) -> None:
        topics["chat.turns"]["partitions"] = 12
        topics["samples.retry"]["configs"]["retention.ms"] = "3600000"

    changed = _edited(settings, tmp_path, edit)
    kinds = {(c.topic, c.kind) for c in admin.apply(changed)}
    prefix = settings.topic_prefix
    assert kinds == {(prefix + "chat.turns", "partitions"), (prefix + "samples.retry", "config")}
    assert admin.plan(changed) == []


def test_lowering_partitions_is_refused_and_changes_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    admin.apply(settings)

    def edit(topics: dict) -> None:
        topics["chat.turns"]["partitions"] = 2  # refused
        topics["policy.versions"]["configs"]["retention.ms"] = "1000"  # would be allowed

    changed = _edited(settings, tmp_path, edit)
    with pytest.raises(TopicPlanError, match="cannot lower a partition count"):
        admin.apply(changed)
    # The allowed config change was not made either.
    assert [c.kind for c in admin.plan(changed)] == ["refused", "config"]


def test_cli_plan_apply_and_second_apply(cli_env: dict[str, str]) -> None:
    plan = turnstream("topics", "plan", env=cli_env)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count("create with") == len(REQUIRED_TOPICS)
    first = turnstream("topics", "apply", env=cli_env)
    assert first.returncode == 0, first.stderr
    assert f"applied {len(REQUIRED_TOPICS)} change(s)" in first.stdout
    second = turnstream("topics", "apply", env=cli_env)
    assert second.returncode == 0
    assert "nothing changed" in second.stdout


def test_cli_refusal_exits_nonzero(cli_env: dict[str, str], tmp_path: Path) -> None:
    assert turnstream("topics", "apply", env=cli_env).returncode == 0
    data = yaml.safe_load((REPO / "topics.yaml").read_text())
    data["topics"]["samples.scored"]["replication_factor"] = 3
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(data))
    result = turnstream("topics", "apply", env={**cli_env, "TURNSTREAM_TOPICS_FILE": str(path)})
    assert result.returncode == 1
    assert "replication factor 1 -> 3" in result.stderr
    assert "nothing was changed" in result.stderr


def test_cluster_profile_on_one_broker_is_refused_before_anything_is_created(
    settings: Settings, cli_env: dict[str, str]
) -> None:
    cluster = settings.model_copy(update={"topics_profile": "cluster"})
    with pytest.raises(TopicPlanError) as info:
        admin.apply(cluster)
    assert str(info.value).startswith(
        f"profile cluster wants replication factor 3 but the cluster at "
        f"{settings.bootstrap_servers} has 1 broker(s); "
    )
    assert "nothing was changed" in str(info.value)
    assert {c.kind for c in admin.plan(settings)} == {"create"}  # none of the topics exists
    plan = turnstream("topics", "plan", "--profile", "cluster", env=cli_env)
    assert plan.returncode == 1
    assert f"against {settings.topics.source} (profile cluster):" in plan.stdout
    assert plan.stdout.count("needs 3 brokers, the cluster has 1") == len(REQUIRED_TOPICS)
    result = turnstream("topics", "apply", "--profile", "cluster", env=cli_env)
    assert result.returncode == 1
    assert "profile cluster wants replication factor 3" in result.stderr
    assert {c.kind for c in admin.plan(settings)} == {"create"}


def test_topics_made_without_the_profile_are_refused_with_how_to_reassign(
    settings: Settings,
) -> None:
    admin.apply(settings)
    changes = admin.plan(settings.model_copy(update={"topics_profile": "cluster"}))
    refused = [c for c in changes if c.kind == "refused"]
    assert len(refused) == len(REQUIRED_TOPICS)
    assert all("kafka-reassign-partitions.sh" in c.detail for c in refused)
    assert all(c.detail.endswith("(the cluster has 1 broker(s))") for c in refused)
