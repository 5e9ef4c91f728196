"""Streamed text that never has to be taken back: holds back a trailing partial UTF-8
character and any tail that could still grow into a stop string.

Decoding is incremental (a window of the last few tokens per chunk, as text-generation
servers do), so a long stream costs O(tokens), not O(tokens^2); the finish chunk comes
from one full decode, so the final text is exactly the non-streamed one."""
from __future__ import annotations

from server.response import CommittedView
from server.tokenizer import Tokenizer


class IncrementalText:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.sent = 0
        self._decoded = ""  # text of output tokens [0, _read)
        self._prefix = 0  # first token of the decode window (context for the next token's spacing)
        self._read = 0  # tokens whose text is in _decoded

    def next_chunk(self, view: CommittedView) -> str:
        if view.finish is not None:
            full = view.text(self.tokenizer)  # trimmed at a matched stop string
            end = len(full)
        else:
            # A reasoning response's halves (openai_api._Part) slice the text: decoded whole.
            full = self._extend(view) if isinstance(view, CommittedView) else view.text(self.tokenizer)
            end = self._safe_end(full)
        chunk = full[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return chunk

    def _extend(self, view: CommittedView) -> str:
        """The text so far, decoding only the tokens added since the last call (plus a short
        window before them, so that a tokenizer's leading-space rules see their context)."""
        ids, skip, spaces = view.output_ids, view.skip_special_tokens, view.spaces_between_special_tokens
        if len(ids) > self._read:
            before = self.tokenizer.decode(ids[self._prefix:self._read], skip, spaces)
            window = self.tokenizer.decode(ids[self._prefix:], skip, spaces)
            if window.endswith("\ufffd"):
                return self._decoded  # a character still split across tokens: wait for the rest
            if window.startswith(before):
                self._decoded += window[len(before):]
            else:  # a tokenizer whose window decode is not additive here: decode it all, once
                self._decoded = self.tokenizer.decode(ids, skip, spaces)
            self._prefix, self._read = self._read, len(ids)
        return self._decoded

    def _safe_end(self, text: str) -> int:
        end = len(text) - 1 if text.endswith("\ufffd") else len(text)
        for stop in self.stops:
            for k in range(min(len(stop) - 1, end), 0, -1):
                if text[end - k : end] == stop[:k]:
                    end -= k
                    break
        return end
