"""What the scoring worker and ``turnstream rescore`` build from the same settings."""

from __future__ import annotations

import logging

from pipeline.errors import ConfigError
from pipeline.rewards.combine import RewardPlan, load_plan
from pipeline.settings import Settings

log = logging.getLogger(__name__)


def load_rewards(settings: Settings) -> RewardPlan | None:
    """The rewards of ``TURNSTREAM_SCORING_REWARDS`` (a RewardPlan), set up; None when unset."""
    path = settings.scoring.rewards
    if path is None:
        return None
    plan = load_plan(path)
    group = plan.group
    if group is not None and group.size is not None and group.size > settings.scoring.window:
        raise ConfigError(
            f"{path}: group.size {group.size} is larger than TURNSTREAM_SCORING_WINDOW "
            f"({settings.scoring.window}): a group's members wait in the judging window, "
            "so it must hold a whole group; raise the window or lower the size"
        )
    plan.setup()
    log.info("scoring with the rewards of %s", path)
    return plan
