"""Constrained decoding (SGLang's ``regex``, ``json_schema``, ``ebnf``) with xgrammar,
SGLang's own grammar backend.

One :class:`Grammars` per server compiles grammars against the served tokenizer
and keeps the compiled ones in a bounded LRU keyed by (kind, text). Each
constrained job holds its own ``xgrammar.GrammarMatcher``: before a token is
chosen, :func:`constrain` sets the logits of every token its grammar does not
allow next to -inf, in that row only; after, the job's matcher accepts the token.

The mask covers the model's vocabulary (``config.vocab_size``, the logits'
width), which may differ from the tokenizer's: ids the tokenizer lacks (lm_head
padding) are never allowed, and tokenizer ids past the model's vocabulary are
dropped (the model cannot produce them).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from pipeline.serving.sampling import GRAMMARS, BadRequest

# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:NN: " and may carry a
# "Check failed: (...) is false: " before the reason.
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:.]+\] \S+:\d+: (Check failed: .*? is false: )?")


def error_reason(exc: BaseException) -> str:
    """The reason an xgrammar compile failed, without its C++ source location."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    first = _XGRAMMAR_PREFIX.sub("", lines[0]) if lines else type(exc).__name__
    return " ".join([first, *lines[1:3]])[:500]


class Grammars:
    """Compiles a request's grammar for the served tokenizer (from any thread).

    ``_compiler`` and ``_cache`` are written and read under ``_lock`` by the event
    loop and executor threads; compiling itself runs outside the lock (xgrammar's
    compiler is thread-safe), so a slow grammar never holds up a cached one.
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_ids: Iterable[int], capacity: int = 256
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        self.capacity = capacity
        self._compiler: Any = None
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    def _the_compiler(self) -> Any:
        """xgrammar's compiler, built on first use (about 0.2 s for a 49k vocabulary)."""
        with self._lock:
            if self._compiler is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids
                )
                # our LRU is the one cache: xgrammar's own would grow without bound
                self._compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
            return self._compiler

    def compile(self, kind: str, text: str) -> Any:
        """The compiled grammar (an ``xgrammar.CompiledGrammar``); BadRequest if it fails."""
        key = (kind, text)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        compiler = self._the_compiler()
        try:
            if kind == "json":
                compiled = compiler.compile_json_schema(text, any_whitespace=True)
            elif kind == "regex":
                compiled = compiler.compile_regex(text)
            else:
                compiled = compiler.compile_grammar(text)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise BadRequest(
                f"Failed to compile {kind} grammar: {error_reason(exc)}", param=GRAMMARS[kind]
            ) from exc
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any) -> Any:
        """A fresh matcher of ``compiled``: one per job, used by the engine thread only."""
        import xgrammar

        return xgrammar.GrammarMatcher(compiled)


def constrain(logits: torch.Tensor, matchers: Sequence[Any | None]) -> None:
    """Mask, in place, each row of ``logits`` [rows, vocab] that has a matcher to the tokens
    its grammar allows next; rows without one are not touched.

    A grammar that allows nothing (a regex of an empty character class) leaves its row
    all zeros, so that choosing from it still works; its matcher then refuses the token chosen.
    """
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return
    import xgrammar

    bitmask = xgrammar.allocate_token_bitmask(len(matchers), logits.shape[-1])
    for i, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill_next_token_bitmask(bitmask, i)
    xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1], indices=rows)
    for i in rows:
        if bool(torch.isneginf(logits[i]).all()):
            logits[i] = 0.0
