"""Packed-batch cursors: where each request's slice of a batch's packed outputs begins.

They live beside the transactions, not inside them, because a discarded segment must still
advance them so that later requests in the batch read their own slices (I3).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class PackedCursor:
    """Offset into one packed output (logprobs, hidden states, input logprobs)."""

    offset: int = 0

    def take(self, length: int) -> slice:
        if length < 0:
            raise ValueError(f"segment length must be >= 0, got {length}")
        segment = slice(self.offset, self.offset + length)
        self.offset += length
        return segment


@dataclass(slots=True)
class BatchCursors:
    """The cursors one batch result is read with; call `take` once per request, in packed order."""

    logprobs: PackedCursor
    hidden_states: PackedCursor
    input_logprobs: PackedCursor

    @classmethod
    def start(cls) -> BatchCursors:
        return cls(PackedCursor(), PackedCursor(), PackedCursor())

    def take(self, num_logprobs: int, num_hidden: int, num_input_logprobs: int = 0) -> tuple[slice, slice, slice]:
        # PackedCursor.take three times, inlined: this runs once per request per step.
        if num_logprobs < 0 or num_hidden < 0 or num_input_logprobs < 0:
            raise ValueError(f"segment lengths must be >= 0, got {(num_logprobs, num_hidden, num_input_logprobs)}")
        lp, hs, ilp = self.logprobs, self.hidden_states, self.input_logprobs
        a, b, c = lp.offset, hs.offset, ilp.offset
        lp.offset, hs.offset, ilp.offset = a + num_logprobs, b + num_hidden, c + num_input_logprobs
        return slice(a, a + num_logprobs), slice(b, b + num_hidden), slice(c, c + num_input_logprobs)
