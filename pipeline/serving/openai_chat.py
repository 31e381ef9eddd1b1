"""OpenAI ``/v1/chat/completions`` as SGLang 0.5.23 answers it (``entrypoints/openai``).

Beyond SGLang: ``return_token_ids`` also works when streaming, and the ids are
given under both SGLang's names (``choices[i].prompt_token_ids``,
``response_token_ids``) and vLLM's (top-level ``prompt_token_ids``,
``choices[i].token_ids``), which the capture proxy reads. The served weight
version is in ``metadata.weight_version`` (and the ``X-Weight-Version`` header).
Grammars as SGLang takes them: ``regex`` and ``ebnf`` beside the OpenAI fields, and
``response_format`` ``json_schema`` (its ``schema``) or ``json_object``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.serving.jobs import Job, Request
from pipeline.serving.sampling import BadRequest, parse_sampling

SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "regex",
    "ebnf",
)


@dataclass(frozen=True)
class ChatCall:
    request: Request
    model: str
    stream: bool
    include_usage: bool
    logprobs: bool
    token_ids: bool
    id: str


def _content(message: Any, index: int) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"messages[{index}] must be an object with a role", param="messages")
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type", "text") != "text":
                raise BadRequest(
                    f"messages[{index}]: only text content parts are supported", param="messages"
                )
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        raise BadRequest(f"messages[{index}].content must be a string or a list of parts")
    return {**message, "content": content}


def _max_new_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise BadRequest(
            f"max_tokens must be a positive integer, got {value!r}", param="max_tokens"
        )
    return value


def _sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    params = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    params["max_new_tokens"] = _max_new_tokens(body)
    if body.get("min_tokens"):
        params["min_new_tokens"] = body["min_tokens"]
    if body.get("seed") is not None:
        params["sampling_seed"] = body["seed"]
    params.update(_response_format(body.get("response_format")))
    return params


def _response_format(fmt: Any) -> dict[str, str]:
    """``response_format`` as SGLang's sampling parameter: a JSON schema, serialised."""
    if fmt is None:
        return {}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": '{"type": "object"}'}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be an object (the JSON schema)",
                param="response_format",
            )
        return {"json_schema": json.dumps(schema)}
    raise BadRequest(
        "response_format must be an object whose type is text, json_object or json_schema",
        param="response_format",
    )


def _top_logprobs(body: dict[str, Any]) -> int:
    top = body.get("top_logprobs") or 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise BadRequest("top_logprobs must be an integer between 0 and 20", param="top_logprobs")
    if top and not body.get("logprobs"):
        raise BadRequest("top_logprobs needs logprobs=true", param="top_logprobs")
    return top


def parse_chat(
    body: Any,
    names: set[str],
    render: Callable[[list[dict[str, Any]], Any, dict[str, Any]], list[int]],
) -> ChatCall:
    """A checked chat request; ``render`` turns messages (and tools) into prompt ids."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("Messages cannot be empty.", param="messages")
    model = body.get("model", "default")
    if not isinstance(model, str) or model not in names:
        raise BadRequest(
            f"The model `{model}` does not exist; this server serves {sorted(names)}",
            status=404,
            param="model",
        )
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise BadRequest(
            "tool_choice other than auto or none is not supported", param="tool_choice"
        )
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    prompt = render([_content(m, i) for i, m in enumerate(messages)], body.get("tools"), kwargs)
    logprobs = body.get("logprobs") is True
    request = Request(
        prompt_ids=prompt,
        sampling=parse_sampling(_sampling_params(body), default_max_new_tokens=None),
        return_logprob=logprobs,
        top_logprobs_num=_top_logprobs(body),
    )
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    return ChatCall(
        request=request,
        model=model,
        stream=body.get("stream") is True,
        include_usage=bool(stream_options.get("include_usage")),
        logprobs=logprobs,
        token_ids=bool(body.get("return_token_ids") or body.get("return_prompt_token_ids")),
        id=f"chatcmpl-{uuid.uuid4().hex}",
    )


def logprob_entries(
    job: Job, start: int, end: int, text: Callable[[int], str]
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content`` entries for output tokens ``start:end``."""
    entries = []
    for i in range(start, end):
        token = text(job.output_ids[i])
        top = [
            {"token": text(t), "bytes": list(text(t).encode()), "logprob": lp}
            for lp, t in job.output_top[i]
        ]
        entries.append(
            {
                "token": token,
                "bytes": list(token.encode()),
                "logprob": job.output_logprobs[i],
                "top_logprobs": top,
            }
        )
    return entries


def finish_reason(job: Job) -> str | None:
    return None if job.finish is None else str(job.finish["type"])


def usage(job: Job) -> dict[str, int]:
    prompt, completion = len(job.request.prompt_ids), len(job.output_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion(call: ChatCall, job: Job, text: Callable[[int], str]) -> dict[str, Any]:
    """The non-streamed chat completion."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": job.text,
            "reasoning_content": None,
            "tool_calls": None,
        },
        "logprobs": {"content": logprob_entries(job, 0, len(job.output_ids), text)}
        if call.logprobs
        else None,
        "finish_reason": finish_reason(job),
        "matched_stop": (job.finish or {}).get("matched"),
    }
    data: dict[str, Any] = {
        "id": call.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": [choice],
        "usage": usage(job),
        "metadata": {"weight_version": job.version},
    }
    if call.token_ids:
        choice.update(
            prompt_token_ids=job.request.prompt_ids,
            response_token_ids=job.output_ids,
            token_ids=job.output_ids,
        )
        data["prompt_token_ids"] = job.request.prompt_ids
    return data


def chunk(call: ChatCall, choice: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (no choice: the usage chunk)."""
    return {
        "id": call.id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": call.model,
        "choices": [] if choice is None else [choice],
        **extra,
    }
