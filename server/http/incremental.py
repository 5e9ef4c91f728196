"""Streamed text that never has to be taken back: holds back a trailing partial UTF-8
character and any tail that could still grow into a stop string."""
from __future__ import annotations

from server.response import CommittedView
from server.tokenizer import Tokenizer


class IncrementalText:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.sent = 0

    def next_chunk(self, view: CommittedView) -> str:
        full = view.text(self.tokenizer)  # trimmed at a matched stop string once finished
        end = len(full) if view.finish is not None else self._safe_end(full)
        chunk = full[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return chunk

    def _safe_end(self, text: str) -> int:
        end = len(text) - 1 if text.endswith("\ufffd") else len(text)
        for stop in self.stops:
            for k in range(min(len(stop) - 1, end), 0, -1):
                if text[end - k : end] == stop[:k]:
                    end -= k
                    break
        return end
