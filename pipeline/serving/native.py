"""SGLang's native ``/generate``: the request body read into Requests, a Job into its answer.

Shapes follow SGLang 0.5.23 (``GenerateReqInput`` in ``managers/io_struct.py``,
``meta_info`` in ``managers/tokenizer_manager.py``): log-probs are
``[logprob, token_id, text-or-null]`` triples; ``input_token_logprobs`` starts at
``logprob_start_len`` and its first entry is always ``[null, id, ...]``, so the
log-prob of prompt token ``k`` needs ``logprob_start_len <= k - 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.serving.jobs import Job, Request, TopLogprobs
from pipeline.serving.sampling import BadRequest, parse_sampling

UNSUPPORTED = (
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "session_params",
    "token_ids_logprob",
    "custom_logit_processor",
    "return_hidden_states",
)


@dataclass(frozen=True)
class GenerateCall:
    requests: list[Request]
    batch: bool
    stream: bool
    text_in_logprobs: bool
    rids: list[str]


def _per_item(body: dict[str, Any], name: str, n: int, default: Any) -> list[Any]:
    value = body.get(name)
    if value is None:
        return [default] * n
    if isinstance(value, list):
        if len(value) != n:
            raise BadRequest(f"{name} has {len(value)} entries for a batch of {n}", param=name)
        return value
    return [value] * n


def _prompts(
    body: dict[str, Any], tokenize: Callable[[str], list[int]]
) -> tuple[list[list[int]], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("Either text or input_ids should be provided.")
    if text is not None:
        if isinstance(text, str):
            return [tokenize(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [tokenize(t) for t in text], True
        raise BadRequest("text must be a string or a non-empty list of strings", param="text")

    def is_ids(v: Any) -> bool:
        return isinstance(v, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in v
        )

    if is_ids(ids) and ids:
        return [list(ids)], False
    if isinstance(ids, list) and ids and all(is_ids(i) for i in ids):
        return [list(i) for i in ids], True
    raise BadRequest(
        "input_ids must be a list of integers or a list of such lists", param="input_ids"
    )


def _parallel_samples(samplings: list[Any]) -> int:
    """``sampling_params.n``: how many samples of each prompt (the same for every prompt);
    removed from the parameters, which then describe one sample each."""
    counts = set()
    for i, raw in enumerate(samplings):
        if isinstance(raw, dict) and "n" in raw:
            raw = dict(raw)
            counts.add(_integer(raw.pop("n"), "sampling_params.n", 1))
            samplings[i] = raw
        else:
            counts.add(1)
    if len(counts) > 1:
        raise BadRequest("sampling_params.n must be the same for every prompt", param="n")
    return counts.pop()


def _integer(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise BadRequest(f"{name} must be an integer >= {low}, got {value!r}", param=name)
    return value


def _each(items: list[Any], times: int) -> list[Any]:
    """[a, b], 2 -> [a, a, b, b]: SGLang's order of a batch's parallel samples."""
    return [item for item in items for _ in range(times)]


def parse_generate(body: Any, tokenize: Callable[[str], list[int]]) -> GenerateCall:
    """The Requests of one /generate body (BadRequest when it is malformed)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], {}):
            raise BadRequest(f"{name} is not supported by this server", param=name)
    prompts, is_batch = _prompts(body, tokenize)
    n = len(prompts)
    samplings = _per_item(body, "sampling_params", n, None)
    parallel = _parallel_samples(samplings)
    if parallel > 1:  # SGLang's parallel sampling: each prompt n times over, its answers together
        prompts, samplings, is_batch = _each(prompts, parallel), _each(samplings, parallel), True
        body = {k: (_each(v, parallel) if isinstance(v, list) and k != "input_ids" and k != "text"
                    else v) for k, v in body.items()}  # fmt: skip
        n = len(prompts)
    logprob = _per_item(body, "return_logprob", n, False)
    starts = _per_item(body, "logprob_start_len", n, -1)
    tops = _per_item(body, "top_logprobs_num", n, 0)
    requests = []
    for i, prompt in enumerate(prompts):
        if not isinstance(logprob[i], bool):
            raise BadRequest("return_logprob must be true or false", param="return_logprob")
        requests.append(
            Request(
                prompt_ids=prompt,
                sampling=parse_sampling(samplings[i]),
                return_logprob=logprob[i],
                logprob_start_len=_integer(starts[i], "logprob_start_len", -1),
                top_logprobs_num=_integer(tops[i], "top_logprobs_num", 0),
            )
        )
    stream = body.get("stream") is True
    if stream and is_batch:
        raise BadRequest("stream is supported for a single prompt only", param="stream")
    rids = _per_item(body, "rid", n, None)
    return GenerateCall(
        requests, is_batch, stream, body.get("return_text_in_logprobs") is True, rids
    )


def _triples(
    values: list[float | None], ids: list[int], text: Callable[[int], str] | None
) -> list[list[Any]]:
    return [[v, i, text(i) if text else None] for v, i in zip(values, ids, strict=True)]


def _tops(tops: list[TopLogprobs | None], text: Callable[[int], str] | None) -> list[Any]:
    return [
        None if top is None else [[v, i, text(i) if text else None] for v, i in top] for top in tops
    ]


def meta_info(
    job: Job, rid: str, text: Callable[[int], str] | None, e2e_s: float
) -> dict[str, Any]:
    """SGLang's meta_info of a finished (or, streaming, running) job."""
    request = job.request
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": job.finish,
        "prompt_tokens": len(request.prompt_ids),
        "completion_tokens": len(job.output_ids),
        "cached_tokens": 0,
        "weight_version": job.version,
        "e2e_latency": round(e2e_s, 4),
    }
    if request.return_logprob:
        start = request.logprob_start_len
        prompt_ids = request.prompt_ids[start:] if start >= 0 else []
        meta["input_token_logprobs"] = _triples(job.input_logprobs, prompt_ids, text)
        meta["output_token_logprobs"] = _triples(list(job.output_logprobs), job.output_ids, text)
        if request.top_logprobs_num > 0:
            meta["input_top_logprobs"] = _tops(job.input_top, text)
            meta["output_top_logprobs"] = _tops(list(job.output_top), text)
    return meta


def answer(
    job: Job,
    rid: str,
    text: Callable[[int], str] | None,
    e2e_s: float,
    partial: str | None = None,
) -> dict[str, Any]:
    """The /generate answer of a finished job (``partial``: the text so far, streaming)."""
    meta = meta_info(job, rid, text, e2e_s)
    if partial is not None:
        meta["finish_reason"] = None
    return {
        "text": job.text if partial is None else partial,
        "output_ids": list(job.output_ids),
        "meta_info": meta,
    }
