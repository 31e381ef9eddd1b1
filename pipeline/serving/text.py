"""The text of a growing output: stop strings found, streamed pieces never taken back."""

from __future__ import annotations

from collections.abc import Callable

REPLACEMENT = "\ufffd"  # a multi-byte character whose bytes have not all arrived


class TextTracker:
    """Decodes an output as tokens arrive; finds stop strings; yields safe deltas.

    A delta never contains text that could still turn out to start a stop
    string, nor a half-decoded character, so a streamed reply equals the final
    text.
    """

    def __init__(
        self, decode: Callable[[list[int]], str], stops: tuple[str, ...], no_stop_trim: bool
    ) -> None:
        self._decode = decode
        self.stops = stops
        self.no_stop_trim = no_stop_trim
        self.ids: list[int] = []
        self.text = ""
        self.matched: str | None = None
        self._cut: int | None = None  # where the text ends once a stop string matched
        self._emitted = 0

    def add(self, token: int) -> bool:
        """Take one token; True when a stop string now appears in the text."""
        before = len(self.text)
        self.ids.append(token)
        self.text = self._decode(self.ids)
        if not self.stops or self.matched is not None:
            return False
        longest = max(len(s) for s in self.stops)
        start = max(0, before - longest)
        found = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if not found:
            return False
        index, stop = min(found)
        self.matched = stop
        self._cut = None if self.no_stop_trim else index
        return True

    def final(self, drop_last: bool = False) -> str:
        """The output's text: cut at a matched stop string, or without a matched stop token."""
        if self._cut is not None:
            return self.text[: self._cut]
        if drop_last and self.ids:
            return self._decode(self.ids[:-1])
        return self.text

    def delta(self, finished: bool = False, drop_last: bool = False) -> str:
        """Text not yet handed out that can no longer change."""
        text = self.final(drop_last) if finished else self._safe()
        piece = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return piece

    def _safe(self) -> str:
        text = self.text
        end = len(text)
        while end and text[end - 1] == REPLACEMENT:
            end -= 1
        hold = 0
        for stop in self.stops:  # hold back a tail that may be the start of a stop string
            for size in range(min(len(stop) - 1, end), hold, -1):
                if text[end - size : end] == stop[:size]:
                    hold = size
                    break
        return text[: end - hold]
