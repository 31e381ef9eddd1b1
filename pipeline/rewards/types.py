"""What a reward processor reads and returns, with the reward SDK's field names.

``RewardInput`` carries the judged turn: ``agent_output.messages`` (the
conversation, as plain dicts), the ``response`` being judged, its
``next_state`` (the evidence that followed, if any), the ``ground_truth`` (if
any) and ``request_metadata``. ``RewardOutput`` carries ``reward`` (the
``reward_score`` and named ``reward_metrics``) and a ``status``: SUCCESS, or
FAILED with an ``error`` saying why. FAILED is for transient trouble (a judge
timeout): the sample is judged again later. A score of 0 is a SUCCESS.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.events import NextState, Paired, Response
from pipeline.judge.prompts import render_content, render_response


class TaskStatus(StrEnum):
    """Whether a processor produced a reward; FAILED means try again later, never a score."""

    SUCCESS = "success"
    FAILED = "failed"


class _Model(BaseModel):
    """Frozen, rejects unknown fields (a misspelt field is an error, not a silent default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class AgentOutput(_Model):
    """What the policy produced: the conversation as OpenAI-style message dicts."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    rollout_extra: dict[str, Any] | None = None
    rollout_metrics: dict[str, float] | None = None
    reward_score: float | None = None


class Reward(_Model):
    """One score and the named metrics behind it."""

    reward_score: float
    reward_metrics: dict[str, float] = Field(default_factory=dict)

    @field_validator("reward_score")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"reward_score must be a finite number, got {value}")
        return value


def check_status(
    status: TaskStatus, error: str | None, payload: object, what: str = "a reward"
) -> None:
    """A FAILED output says why; a SUCCESS output carries its payload, ``what`` (a reward,
    an agent output)."""
    if status is TaskStatus.FAILED and not error:
        raise ValueError("a FAILED output must set error to say why")
    if status is TaskStatus.SUCCESS and payload is None:
        raise ValueError(f"a SUCCESS output must carry {what}")


class RewardInput(_Model):
    """One judged turn, as a reward processor sees it."""

    func_type: Literal["reward"] = "reward"
    agent_output: AgentOutput = Field(default_factory=AgentOutput)
    ground_truth: Any = None
    request_metadata: dict[str, Any] | None = None
    response: Response | None = Field(
        None, description="the assistant output being judged (default: the last assistant message)"
    )
    next_state: NextState | None = Field(
        None, description="the user or tool message that followed: the judge's evidence"
    )


class RewardOutput(_Model):
    reward: Reward | None = None
    status: TaskStatus
    error: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> RewardOutput:
        check_status(self.status, self.error, self.reward)
        return self

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.SUCCESS

    @classmethod
    def success(cls, score: float, metrics: dict[str, float] | None = None) -> RewardOutput:
        return cls(
            reward=Reward(reward_score=score, reward_metrics=metrics or {}),
            status=TaskStatus.SUCCESS,
        )

    @classmethod
    def failed(cls, error: str) -> RewardOutput:
        return cls(status=TaskStatus.FAILED, error=error)

    @property
    def score(self) -> float:
        """The reward score; asking a FAILED output for one is a bug."""
        if self.reward is None:
            raise ValueError(f"a FAILED output has no score (error: {self.error})")
        return self.reward.reward_score


class GroupReward(_Model):
    rewards: list[Reward]


class GroupRewardInput(_Model):
    """Several outputs for the same prompt, scored together (one reward each, in order)."""

    func_type: Literal["group_reward"] = "group_reward"
    agent_outputs: list[AgentOutput] = Field(min_length=1)
    ground_truth: Any = None
    request_metadata: dict[str, Any] | None = None
    group_key: str | None = Field(None, description="what the members share (a prompt id)")


class GroupRewardOutput(_Model):
    reward: GroupReward | None = None
    status: TaskStatus
    error: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> GroupRewardOutput:
        check_status(self.status, self.error, self.reward)
        return self

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.SUCCESS


def assistant_message(response: Response) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": response.content}
    if response.tool_calls:
        message["tool_calls"] = response.tool_calls
    return message


def response_text(input: RewardInput) -> str:
    """The judged output as text: ``response``, else the last assistant message, else ""."""
    if input.response is not None:
        return render_response(input.response.content, input.response.tool_calls)
    for message in reversed(input.agent_output.messages):
        if message.get("role") == "assistant":
            content = render_content(message.get("content")) or None
            return render_response(content, message.get("tool_calls"))
    return ""


def reward_input_from_paired(paired: Paired, ground_truth: Any = None) -> RewardInput:
    """The reward input of a paired turn: its prompt and response, its next state, its ids.

    The ground truth is ``ground_truth`` if given, else the turn's own. The final turn
    of a rollout stands for the whole rollout: its ``agent_output`` holds the
    rollout's own messages (when its processor returned any), and ``response`` is
    left out so the judged output is their last assistant message.
    """
    turn = paired.turn
    messages = [m.model_dump(exclude_none=True) for m in turn.messages]
    said = [*messages, assistant_message(turn.response)]
    whole = paired.rollout_final and paired.rollout_messages is not None
    return RewardInput(
        agent_output=AgentOutput(messages=paired.rollout_messages if whole else said),
        ground_truth=turn.ground_truth if ground_truth is None else ground_truth,
        request_metadata={
            "sample_id": paired.sample_id,
            "session_id": turn.session_id,
            "turn_index": turn.turn_index,
            "policy_version": turn.policy_version,
            "attempt": paired.attempt,
            "group_id": turn.group_id,
            **({"rollout_final": True} if paired.rollout_final else {}),
        },
        response=None if whole else turn.response,  # a whole rollout: its last assistant message
        next_state=paired.next_state,
    )
