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
        return (self.logprobs.take(num_logprobs), self.hidden_states.take(num_hidden),
                self.input_logprobs.take(num_input_logprobs))
