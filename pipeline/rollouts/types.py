"""What a rollout processor reads and returns, with the rollout SDK's field names.

A task is a ``RolloutInput``: the conversation so far (``messages``), the
``tools`` offered, the ``ground_truth`` (if any), ``sampling_params`` (with
``max_turns`` and ``timeout``), the policy's ``model_resource`` (model name,
base URL, API key) and ``request_metadata`` (job, sample, rollout and attempt
ids). A field it does not know is kept in ``rollout_extra``, not refused: a
task file written for another runner still loads. A ``RolloutOutput`` carries
the ``agent_output`` (the trajectory's messages, which the reward processors
read) and a ``status``: SUCCESS, or FAILED with an ``error`` saying why (an
LLM timeout, a broken tool): the sample is tried again or dropped.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from pipeline.rewards.types import AgentOutput, TaskStatus, check_status
from pipeline.rollouts.trace import RolloutTrace

# Request fields of OpenAI's chat.completions.create; other sampling fields (top_k,
# repetition_penalty, min_p, ...) go to the server in the request's extra body.
OPENAI_SAMPLING_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
    }
)


class ModelResource(BaseModel):
    """The policy a rollout talks to, as an OpenAI-compatible server.

    ``api_key`` is a plain string, not a ``SecretStr``, because processors
    written for the SDK hand it to their own clients as is; it is left out of
    ``repr`` so that it does not reach a log.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_name: str = ""
    base_url: str = Field("", description="the OpenAI-compatible root, e.g. http://host:30000/v1")
    api_key: str = Field("", repr=False)


class SamplingParams(BaseModel):
    """How the policy samples, and the rollout's bounds; other sampling fields are kept."""

    model_config = ConfigDict(frozen=True, extra="allow")

    max_turns: int = Field(25, ge=1, description="model calls one rollout may make")
    timeout: float = Field(
        60.0, gt=0, description="seconds the rollout may take; bounds each model call too"
    )
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = Field(None, ge=1)

    def request_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(create() keywords, extra body)``: the sampling fields set, bounds excluded."""
        fields = self.model_dump(exclude={"max_turns", "timeout"}, exclude_none=True)
        known = {k: v for k, v in fields.items() if k in OPENAI_SAMPLING_FIELDS}
        extra = {k: v for k, v in fields.items() if k not in OPENAI_SAMPLING_FIELDS}
        return known, extra


class RolloutInput(BaseModel):
    """One task, as a rollout processor sees it; ``trace`` records what the rollout did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    func_type: Literal["rollout"] = "rollout"
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    ground_truth: Any = None
    rollout_extra: dict[str, Any] = Field(
        default_factory=dict, description="the task's own fields, and any field not known here"
    )
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    model_resource: ModelResource = Field(default_factory=ModelResource)
    request_metadata: dict[str, Any] | None = None

    # Written by the wrappers of trace_client and trace_tool (their own lock), read by the
    # rollout stage once process() has returned.
    _trace: RolloutTrace = PrivateAttr(default_factory=RolloutTrace)

    @model_validator(mode="before")
    @classmethod
    def _keep_unknown_fields(cls, data: Any) -> Any:
        """Unknown top-level fields move into ``rollout_extra``; null lists become empty."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key, empty in (("messages", []), ("rollout_extra", {})):
            if key in data and data[key] is None:
                data[key] = empty
        unknown = {k: data.pop(k) for k in list(data) if k not in cls.model_fields}
        extra = data.get("rollout_extra", {})
        if not unknown or not isinstance(extra, dict):
            return {**data, **unknown}
        clashes = sorted(k for k in unknown if k in extra and extra[k] != unknown[k])
        if clashes:
            raise ValueError(
                f"field(s) {', '.join(clashes)} given both at the top level and in "
                "rollout_extra, with different values; keep one"
            )
        return {**data, "rollout_extra": {**extra, **unknown}}

    def __copy__(self) -> Self:
        """A copy (``model_copy`` too) is another rollout of the task: its trace starts empty."""
        copied = super().__copy__()
        copied._trace = RolloutTrace()
        return copied

    @property
    def trace(self) -> RolloutTrace:
        """The model and tool calls made for this input through trace_client and trace_tool."""
        return self._trace


class RolloutOutput(BaseModel):
    """A trajectory, or why there is none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_output: AgentOutput = Field(default_factory=AgentOutput)
    status: TaskStatus
    error: str | None = None
    rollout_metrics: dict[str, float] | None = Field(
        None, description="the rollout's own metrics (the SDK guide puts them on agent_output)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> RolloutOutput:
        check_status(self.status, self.error, self.agent_output, "an agent_output")
        return self

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.SUCCESS
