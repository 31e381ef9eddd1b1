"""SGLang's ``sampling_params``: parsed and checked (pure), and applied to a batch of logits.

Greedy (temperature 0, or top_k 1) takes the argmax of the raw logits. A sampled
token's reported log-prob is ``log_softmax(logits / T)`` before top-p/top-k/min-p
filtering, as SGLang reports it (``original=True``: the raw log-softmax, SGLang's
``SGLANG_RETURN_ORIGINAL_LOGPROB``). A grammar (``regex``, ``json_schema``, ``ebnf``)
is only checked here; :mod:`pipeline.serving.grammar` compiles and applies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GREEDY_EPS = 1e-6
# Accepted only at their neutral value: this server does not implement them.
NEUTRAL = {
    "n": 1,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "structural_tag": None,
    "logit_bias": None,
    "custom_params": None,
    "stop_regex": None,
    "beam_width": None,
}
IGNORED = {"stream_interval", "spaces_between_special_tokens", "watermark"}
# SGLang's grammar parameters, by the kind name its grammar cache and errors use.
GRAMMARS = {"json": "json_schema", "regex": "regex", "ebnf": "ebnf"}


class BadRequest(ValueError):
    """A request this server cannot serve as sent: answered with a 4xx, never a 500."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int | None = 128  # None: what the context length leaves
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    json_schema: str | None = None  # a JSON schema, serialised
    regex: str | None = None
    ebnf: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, text) of the grammar the output must follow: kind is json, regex or ebnf."""
        for kind, name in GRAMMARS.items():
            text = getattr(self, name)
            if text is not None:
                return kind, text
        return None


def _number(raw: dict[str, Any], name: str, default: float) -> float:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"sampling_params.{name} must be a number, got {value!r}", param=name)
    return float(value)


def _integer(raw: dict[str, Any], name: str, default: int | None) -> int | None:
    value = raw.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"sampling_params.{name} must be an integer, got {value!r}", param=name)
    return value


def _flag(raw: dict[str, Any], name: str) -> bool:
    value = raw.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"sampling_params.{name} must be true or false", param=name)
    return value


def _stops(raw: dict[str, Any]) -> tuple[tuple[str, ...], frozenset[int]]:
    stop = raw.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (
        isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)
    ):
        raise BadRequest("sampling_params.stop must be a string or a list of strings", param="stop")
    ids = raw.get("stop_token_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise BadRequest("sampling_params.stop_token_ids must be a list of integers")
    return tuple(stop or ()), frozenset(ids or ())


def _grammars(raw: dict[str, Any]) -> dict[str, str]:
    """The grammar parameters that are set: SGLang allows one at most."""
    given = {name: raw[name] for name in GRAMMARS.values() if raw.get(name) is not None}
    for name, value in given.items():
        if not isinstance(value, str):
            shape = " (a JSON schema serialised to a string, e.g. with json.dumps)"
            raise BadRequest(
                f"sampling_params.{name} must be a string"
                f"{shape if name == 'json_schema' else ''}, got {type(value).__name__}",
                param=name,
            )
    if len(given) > 1:
        raise BadRequest(
            "Only one of regex, json_schema, or ebnf can be set.", param=sorted(given)[0]
        )
    return given


def parse_sampling(raw: Any, default_max_new_tokens: int | None = 128) -> Sampling:
    """A checked Sampling from SGLang's ``sampling_params`` object (BadRequest if invalid)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("sampling_params must be an object")
    known = set(Sampling.__dataclass_fields__) | set(NEUTRAL) | IGNORED | {"sampling_seed"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise BadRequest(f"unknown sampling parameter(s) {unknown}", param=unknown[0])
    for name, neutral in NEUTRAL.items():
        if raw.get(name) not in (None, neutral):
            raise BadRequest(
                f"sampling_params.{name}={raw[name]!r} is not supported by this server "
                f"(only {neutral!r})",
                param=name,
            )
    stop, stop_ids = _stops(raw)
    top_k = _integer(raw, "top_k", -1)
    sampling = Sampling(
        max_new_tokens=_integer(raw, "max_new_tokens", default_max_new_tokens),
        min_new_tokens=_integer(raw, "min_new_tokens", 0) or 0,
        temperature=_number(raw, "temperature", 1.0),
        top_p=_number(raw, "top_p", 1.0),
        top_k=-1 if top_k is None or top_k >= 1 << 30 else top_k,
        min_p=_number(raw, "min_p", 0.0),
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=_flag(raw, "ignore_eos"),
        skip_special_tokens=raw.get("skip_special_tokens") is not False,
        no_stop_trim=_flag(raw, "no_stop_trim"),
        seed=_integer(raw, "sampling_seed", None),
        **_grammars(raw),
    )
    _check_ranges(sampling)
    return sampling


def _check_ranges(s: Sampling) -> None:
    """SGLang's SamplingParams.verify, with its messages."""
    if s.temperature < 0:
        raise BadRequest(
            f"temperature must be non-negative, got {s.temperature}.", param="temperature"
        )
    if not 0.0 < s.top_p <= 1.0:
        raise BadRequest(f"top_p must be in (0, 1], got {s.top_p}.", param="top_p")
    if not 0.0 <= s.min_p <= 1.0:
        raise BadRequest(f"min_p must be in [0, 1], got {s.min_p}.", param="min_p")
    if s.top_k < 1 and s.top_k != -1:
        raise BadRequest(
            f"top_k must be -1 (disable), or at least 1, got {s.top_k}.", param="top_k"
        )
    if s.min_new_tokens < 0:
        raise BadRequest(f"min_new_tokens must be at least 0, got {s.min_new_tokens}.")
    if s.max_new_tokens is not None:
        if s.max_new_tokens < 0:
            raise BadRequest(f"max_new_tokens must be at least 0, got {s.max_new_tokens}.")
        if s.min_new_tokens > s.max_new_tokens:
            raise BadRequest(
                f"min_new_tokens must be in [0, max_new_tokens({s.max_new_tokens})], "
                f"got {s.min_new_tokens}."
            )
