"""Event schemas of every topic, encoded as JSON with orjson.

Input events (``turn``, ``message``, ``session_end``) enter ``chat.turns``; the
scoring stage emits ``paired`` and ``sample`` events; bad input becomes a
``deadletter`` event. Every event carries ``type`` and ``schema_version``.
Decoding returns a typed object or raises :class:`EventDecodeError` naming the
field and the problem.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from pipeline.errors import EventDecodeError

SCHEMA_VERSION: Literal[1] = 1
MAX_SESSION_ID_CHARS = 256

# (log-prob, token id): JSON has no tuples, so each arrives as a two-item array, which the
# strict models would refuse as a tuple
TopEntry = Annotated[tuple[float, int], Strict(False)]
ExcludeReason = Literal[
    "no_next_state", "neutral_score", "no_hint", "hint_rejected", "rollout_failed"
]
MAX_GROUP_SIZE = 1024
SessionId = Annotated[str, Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)]
GroupId = Annotated[str, Field(min_length=1, max_length=MAX_SESSION_ID_CHARS)]
Content = str | list[dict[str, Any]] | None


class _Strict(BaseModel):
    """Frozen, rejects unknown fields (a typo in a field name is an error, not data loss)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ChatMessage(BaseModel):
    """One OpenAI-style chat message; extra provider fields are kept as they are."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content = None
    tool_calls: list[dict[str, Any]] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class Response(_Strict):
    """What the policy answered in a turn."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = Field(
        None, description="a thinking model's reasoning, trained where the chat template renders it"
    )
    finish_reason: str | None = Field(
        None,
        description="why generation stopped, as the server said (stop, length, tool_calls); "
        "a response cut at its length limit trains without an end-of-turn token",
    )


class NextState(_Strict):
    """The message that followed a turn: the evidence the judge reads."""

    role: Literal["user", "tool"]
    content: Content = None
    name: str | None = None
    tool_call_id: str | None = None


class _Event(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    session_id: SessionId
    ts: float = Field(ge=0, description="event time, seconds since the Unix epoch")


class Turn(_Event):
    """One policy turn: the prompt context and the response to it."""

    type: Literal["turn"]
    turn_index: int = Field(ge=0, description="position in the session, from 0")
    turn_type: Literal["main", "side"]
    messages: list[ChatMessage] = Field(min_length=1)
    response: Response
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    policy_version: int | None = Field(None, ge=0)
    group_id: GroupId | None = Field(
        None,
        description="turns sharing it are outputs for one prompt: a group reward scores them "
        "together and the trainer can take advantages relative to the group",
    )
    group_size: int | None = Field(
        None, ge=1, le=MAX_GROUP_SIZE, description="how many outputs the group will have"
    )
    ground_truth: Any = Field(
        None, description="reference answer for reward processors; never shown to the judge"
    )
    rollout: bool = Field(
        False,
        description="a turn of a rollout attempt (the proxy's /rollouts/ route): its pairs wait "
        "for the session's end and train only if the attempt succeeded",
    )

    @model_validator(mode="after")
    def _logprobs_match_ids(self) -> Turn:
        lp, ids = self.response_logprobs, self.response_ids
        if lp is not None and ids is not None and len(lp) != len(ids):
            raise ValueError(
                f"response_logprobs has {len(lp)} entries but response_ids has {len(ids)}"
            )
        if self.group_size is not None and self.group_id is None:
            raise ValueError("group_size is set but group_id is not: name the group")
        return self

    @property
    def sample_id(self) -> str:
        return f"{self.session_id}:{self.turn_index}"


class Message(_Event):
    """A follow-up user or tool message: the next state of the pending turn."""

    type: Literal["message"]
    message: NextState


class SessionEnd(_Event):
    """The session is over: its pending turn has no next state.

    ``reason`` is ``client`` when the app ended it (or a rollout attempt
    succeeded), ``idle_timeout`` when a scoring worker found it idle (that
    decision is on the log too), ``rollout_failed`` when the rollout stage ended
    a failed attempt: none of that session's turns trains.
    """

    type: Literal["session_end"]
    reason: Literal["client", "idle_timeout", "rollout_failed"] = "client"
    rollout_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="a successful rollout's own metrics (RolloutOutput.rollout_metrics); "
        "each of the session's samples carries them in reward_metrics as rollout/<name>",
    )
    ground_truth: Any = Field(
        None,
        description="a successful rollout's task ground truth: set on each of its turns for "
        "the reward processors (never shown to the judge)",
    )
    agent_messages: list[dict[str, Any]] | None = Field(
        None,
        description="a successful rollout's AgentOutput messages: its last turn is scored on "
        "them by the reward processors, with no next state needed",
    )


InputEvent = Annotated[Turn | Message | SessionEnd, Field(discriminator="type")]


class Paired(_Strict):
    """A main turn with its next state (or none), ready for the judge."""

    type: Literal["paired"] = "paired"
    schema_version: Literal[1] = SCHEMA_VERSION
    sample_id: str
    turn: Turn
    next_state: NextState | None
    first_judged: bool = Field(
        description="the session's first turn with a next state (at-least-one guarantee)"
    )
    paired_ts: float
    attempt: int = Field(1, ge=1, description="1, or more when fed back from samples.retry")
    exclude_reason: ExcludeReason | None = Field(
        None,
        description="set by the pairing stage for a turn that must not train (a failed "
        "rollout attempt's): it is recorded as an excluded sample without being judged",
    )
    rollout_metrics: dict[str, float] = Field(
        default_factory=dict, description="the rollout's metrics, from its session's end"
    )
    rollout_final: bool = Field(
        False,
        description="the last turn of a successful rollout: reward processors score the whole "
        "rollout on it (rollout_messages, the turn's ground_truth), with or without a next state",
    )
    rollout_messages: list[dict[str, Any]] | None = Field(
        None, description="the rollout's AgentOutput messages, on its final turn"
    )

    @property
    def route_key(self) -> bytes:
        """Its Kafka key: the group's id (members meet on one partition), else the session's."""
        return (self.turn.group_id or self.turn.session_id).encode()


class JudgeIdentity(_Strict):
    backend: Literal["rules", "sglang", "openai"]
    model: str | None = None
    prompt_version: str
    urls: list[str] = Field(default_factory=list)


class Sample(_Strict):
    """A scored sample: what the trainer consumes (and what audits and replays read)."""

    type: Literal["sample"] = "sample"
    schema_version: Literal[1] = SCHEMA_VERSION
    sample_id: str
    session_id: SessionId
    turn_index: int = Field(ge=0)
    messages: list[ChatMessage]
    response: Response
    tools: list[dict[str, Any]] | None = Field(
        None, description="the turn's tool definitions (the chat template renders them)"
    )
    next_state: NextState | None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    score: float
    votes: list[int | None]
    judge_calls: int = Field(ge=0)
    exclude_reason: ExcludeReason | None
    loss_mask: int = Field(ge=0, le=1, description="1 = train on it, 0 = excluded")
    mode: Literal["rl", "opd", "combine"]
    hint: str | None = None
    teacher_logprobs: list[float] | None = None
    teacher_top_logprobs: list[list[TopEntry]] | None = Field(
        None, description="per response token, the teacher's top-K (log-prob, token id)"
    )
    teacher_neutral_logprobs: list[float] | None = Field(
        None,
        description="the teacher's log-probs of the response with a neutral line in the "
        "hint's place (teacher_contrast): the trainer's OPD advantage is then "
        "teacher_logprobs - these, the hint's own effect",
    )
    policy_version: int | None = None
    judge: JudgeIdentity
    timings: dict[str, float] = Field(default_factory=dict)
    reward_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="named metrics of the reward processors (TURNSTREAM_SCORING_REWARDS)",
    )
    group_id: str | None = None
    group_scores: list[float] | None = Field(
        None,
        description="scores of every member of its group as scored together, in member order "
        "(the trainer's group-relative advantages come from these)",
    )
    group_index: int | None = Field(None, ge=0, description="its own place in group_scores")

    @model_validator(mode="after")
    def _group_consistent(self) -> Sample:
        scores, index = self.group_scores, self.group_index
        if (scores is None) != (index is None):
            raise ValueError("group_scores and group_index go together")
        if scores is not None and index is not None and index >= len(scores):
            raise ValueError(f"group_index {index} is outside group_scores ({len(scores)})")
        return self


class RetryRecord(_Strict):
    """A pair whose judge calls failed transiently: to be judged again, never scored 0."""

    type: Literal["retry"] = "retry"
    schema_version: Literal[1] = SCHEMA_VERSION
    paired: Paired
    error: str
    attempts: int = Field(ge=1, description="how many times this pair failed so far")
    failed_ts: float


class DeadLetter(_Strict):
    """Input that could not be used, with why and where it came from."""

    type: Literal["deadletter"] = "deadletter"
    schema_version: Literal[1] = SCHEMA_VERSION
    stage: str = Field(description="which stage rejected it: produce, pair, score, train")
    error: str
    source: str = Field(description="topic/partition/offset or file:line")
    raw_b64: str
    raw_bytes: int = Field(description="size of the original input")
    truncated: bool = False
    ts: float


MAX_NOTE_CHARS = 2000


class Review(_Strict):
    """A human verdict on a scored sample (``reviews``, key = sample_id: the latest counts).

    It carries the judged turn (prompt, response, next state), so a review is a gold line
    on its own after the sample has left samples.scored's retention."""

    type: Literal["review"] = "review"
    schema_version: Literal[1] = SCHEMA_VERSION
    sample_id: str
    session_id: SessionId
    policy_version: int | None = None
    verdict: Literal[-1, 0, 1] = Field(description="the reviewer's score of the response")
    note: str | None = Field(None, max_length=MAX_NOTE_CHARS)
    judge_score: float = Field(description="the sample's score when it was reviewed")
    messages: list[ChatMessage]
    response: Response
    next_state: NextState | None
    ts: float = Field(ge=0, description="when it was reviewed, seconds since the Unix epoch")


_INPUT_ADAPTER: TypeAdapter[Turn | Message | SessionEnd] = TypeAdapter(InputEvent)


def _field_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _raise_first(exc: ValidationError, tagged: bool = False) -> None:
    """Raise EventDecodeError for the first problem; ``tagged``: loc starts with the union tag."""
    err = exc.errors(include_url=False)[0]
    more = len(exc.errors()) - 1
    problem = err["msg"].removeprefix("Value error, ") + (
        f" (and {more} more problem{'s' * (more > 1)})" if more else ""
    )
    if err["type"] == "missing":
        problem = "required field is missing"
    elif err["type"] == "extra_forbidden":
        problem = "unknown field (check its spelling)"
    loc = err["loc"][1:] if tagged else err["loc"]
    raise EventDecodeError(_field_path(loc), problem) from exc


def _load_json(raw: bytes | str | None) -> Any:
    if raw is None:
        raise EventDecodeError("", "the record has no value (a tombstone)")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if isinstance(raw, bytes):  # say where, when the bytes are not UTF-8 at all
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise EventDecodeError("", f"not valid UTF-8 at byte {bad.start}") from bad
        raise EventDecodeError("", f"not valid JSON: {exc}") from exc


def decode_input(raw: bytes | str | None) -> Turn | Message | SessionEnd:
    """Decode one ``chat.turns`` event; raise EventDecodeError on anything wrong."""
    return input_event(_load_json(raw))


def input_event(data: Any) -> Turn | Message | SessionEnd:
    """Validate one ``chat.turns`` event given as a dict (parsed JSON, or built in code)."""
    if not isinstance(data, dict):
        raise EventDecodeError("", f"expected a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind not in ("turn", "message", "session_end"):
        raise EventDecodeError("type", f"expected 'turn', 'message' or 'session_end', got {kind!r}")
    try:
        return _INPUT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        _raise_first(exc, tagged=True)
        raise  # unreachable


M = TypeVar("M", bound=BaseModel)


def decode_as(model: type[M], raw: bytes | str | None) -> M:
    """Decode an event of a known kind (paired, sample, deadletter)."""
    data = _load_json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        _raise_first(exc)
        raise


def encode(event: BaseModel) -> bytes:
    """The JSON bytes of an event, as they go on a topic."""
    return event.__pydantic_serializer__.to_json(event)


def dead_letter(
    stage: str, error: str, source: str, raw: bytes | None, ts: float, max_raw_bytes: int
) -> DeadLetter:
    """A dead-letter record; raw input above ``max_raw_bytes`` is kept truncated."""
    raw = raw or b""
    kept = raw[:max_raw_bytes]
    return DeadLetter(
        stage=stage,
        error=error,
        source=source,
        raw_b64=base64.b64encode(kept).decode("ascii"),
        raw_bytes=len(raw),
        truncated=len(kept) < len(raw),
        ts=ts,
    )


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of every event, by file name, for producers in other languages."""
    return {
        "input-event.schema.json": _INPUT_ADAPTER.json_schema(),
        "turn.schema.json": Turn.model_json_schema(),
        "message.schema.json": Message.model_json_schema(),
        "session_end.schema.json": SessionEnd.model_json_schema(),
        "paired.schema.json": Paired.model_json_schema(),
        "sample.schema.json": Sample.model_json_schema(),
        "retry.schema.json": RetryRecord.model_json_schema(),
        "deadletter.schema.json": DeadLetter.model_json_schema(),
        "review.schema.json": Review.model_json_schema(),
    }
