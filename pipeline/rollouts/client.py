"""``trace_client``: the official OpenAI client of a rollout, recording each chat completion.

The client is a real ``openai.AsyncOpenAI`` (``openai.OpenAI`` with
``sync=True``) on ``input.model_resource`` (base URL, API key), with
``sampling_params.timeout`` on every request and two retries. Its
``chat.completions.create`` asks for the rollout's model and sampling fields
unless the call names its own, and records each completion on
``input.trace`` as a ``ModelCall``. A traced call returns one whole
completion: ``stream=True`` and ``n`` above 1 are refused, since a rollout is
one trajectory. The rest of the client (models, embeddings, ...) is the
plain SDK and is not traced.
"""

from __future__ import annotations

import copy
import time
from functools import cached_property
from typing import Any, Literal, overload

import openai
from openai.resources.chat import AsyncChat, AsyncCompletions, Chat, Completions
from openai.types.chat import ChatCompletion

from pipeline.errors import RolloutError
from pipeline.rollouts.trace import ModelCall
from pipeline.rollouts.types import RolloutInput

MAX_RETRIES = 2
_NOT_PARAMS = frozenset(
    {"model", "messages", "tools", "extra_headers", "extra_query", "timeout", "extra_body"}
)


def chat_request(input: RolloutInput, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of one create(): the rollout's model and sampling fields under the call's."""
    known, extra = input.sampling_params.request_fields()
    request: dict[str, Any] = {"model": input.model_resource.model_name, **known, **kwargs}
    if extra:
        request["extra_body"] = {**extra, **(kwargs.get("extra_body") or {})}
    if request.get("stream"):
        raise RolloutError(
            "trace_client records whole completions: call chat.completions.create "
            "without stream=True"
        )
    if request.get("n") not in (None, 1):
        raise RolloutError(f"a rollout is one trajectory: ask for one choice, not n={request['n']}")
    if not request["model"]:
        raise RolloutError("no model to ask: model_resource.model_name is empty; pass model=")
    return request


def _plain(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):  # a ChatCompletionMessage appended as it came back
        return dict(message.model_dump(exclude_none=True))
    return copy.deepcopy(dict(message))


def asked(request: dict[str, Any]) -> dict[str, Any]:
    """What one create() asks, copied when it is sent: later changes to the list do not count."""
    tools = request.get("tools")
    return {
        "model": str(request["model"]),
        "messages": [_plain(m) for m in request.get("messages") or []],
        "tools": [_plain(t) for t in tools] if isinstance(tools, list) else None,
        "params": {
            k: copy.deepcopy(v)
            for k, v in request.items()
            if k not in _NOT_PARAMS and not isinstance(v, openai.Omit | openai.NotGiven)
        },
    }


def model_call(
    index: int, question: dict[str, Any], completion: Any, duration_s: float
) -> ModelCall:
    """The record of one completion; anything but a parsed ``ChatCompletion`` is refused."""
    if not isinstance(completion, ChatCompletion):
        raise RolloutError(
            f"trace_client records parsed completions, got a {type(completion).__name__} "
            "(with_raw_response and with_streaming_response are not traced)"
        )
    choice = completion.choices[0]
    return ModelCall(
        index=index,
        **question,
        response=choice.message.model_dump(exclude_none=True),
        finish_reason=choice.finish_reason,
        usage=completion.usage.model_dump(exclude_none=True) if completion.usage else None,
        duration_s=duration_s,
    )


class TracedAsyncCompletions(AsyncCompletions):
    async def create(self, **kwargs: Any) -> Any:
        rollout: RolloutInput = self._client.rollout  # type: ignore[attr-defined]
        request = chat_request(rollout, kwargs)
        question, index, started = asked(request), rollout.trace.start(), time.perf_counter()
        completion = await super().create(**request)
        rollout.trace.add(model_call(index, question, completion, time.perf_counter() - started))
        return completion


class TracedAsyncChat(AsyncChat):
    @cached_property
    def completions(self) -> TracedAsyncCompletions:
        return TracedAsyncCompletions(self._client)


class TracedAsyncOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` whose chat completions are recorded on ``rollout.trace``."""

    def __init__(self, rollout: RolloutInput, **options: Any) -> None:
        super().__init__(**options)
        self.rollout = rollout

    @cached_property
    def chat(self) -> TracedAsyncChat:
        return TracedAsyncChat(self)


class TracedCompletions(Completions):
    def create(self, **kwargs: Any) -> Any:
        rollout: RolloutInput = self._client.rollout  # type: ignore[attr-defined]
        request = chat_request(rollout, kwargs)
        question, index, started = asked(request), rollout.trace.start(), time.perf_counter()
        completion = super().create(**request)
        rollout.trace.add(model_call(index, question, completion, time.perf_counter() - started))
        return completion


class TracedChat(Chat):
    @cached_property
    def completions(self) -> TracedCompletions:
        return TracedCompletions(self._client)


class TracedOpenAI(openai.OpenAI):
    """``openai.OpenAI`` whose chat completions are recorded on ``rollout.trace``."""

    def __init__(self, rollout: RolloutInput, **options: Any) -> None:
        super().__init__(**options)
        self.rollout = rollout

    @cached_property
    def chat(self) -> TracedChat:
        return TracedChat(self)


@overload
def trace_client(
    input: RolloutInput, *, sync: Literal[False] = False, http_client: Any = None
) -> TracedAsyncOpenAI: ...


@overload
def trace_client(
    input: RolloutInput, *, sync: Literal[True], http_client: Any = None
) -> TracedOpenAI: ...


def trace_client(
    input: RolloutInput, *, sync: bool = False, http_client: Any = None
) -> TracedAsyncOpenAI | TracedOpenAI:
    """An OpenAI client on ``input.model_resource`` that records each completion.

    ``http_client`` (an ``openai.DefaultAsyncHttpxClient``, or the sync one)
    shares one connection pool between rollouts; without it the client has a
    pool of its own, released by ``close()`` or ``async with``.
    """
    resource = input.model_resource
    if not resource.base_url:
        raise RolloutError(
            "model_resource.base_url is empty: the rollout has no model server to call"
        )
    options: dict[str, Any] = {
        "base_url": resource.base_url,
        # never the environment's OPENAI_API_KEY, which belongs to another server
        "api_key": resource.api_key or "EMPTY",
        "timeout": input.sampling_params.timeout,
        "max_retries": MAX_RETRIES,
    }
    if http_client is not None:
        options["http_client"] = http_client
    if sync:
        return TracedOpenAI(input, **options)
    return TracedAsyncOpenAI(input, **options)
