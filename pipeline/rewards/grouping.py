"""``group:`` in a rewards file: a group processor and how its members are gathered.

The scoring worker scores grouped turns with a scorer built from a :class:`GroupPlan`
(``pipeline.scoring.groups``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.rewards.protocols import GroupRewardProcessor


class GroupSpec(BaseModel):
    """``group:`` in a rewards file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classpath: str = Field(min_length=1)
    name: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    size: int | None = Field(
        None, ge=1, description="members to wait for when a turn does not say (group_size)"
    )
    timeout_s: float = Field(
        30.0, gt=0, description="score the members present this long after the first one"
    )

    @field_validator("timeout_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        return value


@dataclass(frozen=True)
class GroupPlan:
    """A loaded group reward, ready to become a scoring worker's group scorer."""

    processor: GroupRewardProcessor
    name: str
    size: int | None
    timeout_s: float
