"""The schedule in the log: one FORWARD record per launched forward, and the engine settings that
change numerics (in SERVER_START). Batched numerics depend on the batch, so re-executing a log bit
for bit needs both; `verify` links every COMMIT/DISCARD to the forward it came from.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commitlog.codec import Entry, Kind, Payload
from commitlog.errors import CorruptRecordError

FORWARD_MODES = ("extend", "decode", "mixed")
# SERVER_START keys (its `engine` map) that change a forward's numerics or the KV layout; see FORMAT.md.
ENGINE_KEYS = ("model_path", "dtype", "attention_backend", "linear_backend", "num_threads", "prefill_threads",
               "small_decode_rows", "mixed_chunk", "overlap", "chunked_prefill_size", "max_prefill_tokens", "kv_tokens",
               "max_running_requests", "context_len", "reasoning_parser", "tokenizer_path", "compiled", "software",
               "radix_cache", "sampler", "kernels")


@dataclass(frozen=True, slots=True)
class Segment:
    """One member of a forward: `prefix` KV tokens the request held before it, then `length` new ones.

    A decode segment is one token at a position at or past the prompt (`prefix >= prompt_len`); an
    extend segment is a prompt slice. A prefix-cache hit is an extend whose first `prefix` is > 0."""

    rid: str
    prefix: int
    length: int


@dataclass(frozen=True, slots=True)
class Forward:
    seq: int  # launch counter of the server instance, from 1
    mode: str
    pending: int  # forwards launched earlier whose results were still unprocessed at this launch
    segments: tuple[Segment, ...]

    def to_entry(self) -> Entry:
        s = self.segments
        return forward_entry(self.seq, self.mode, self.pending, [m.rid for m in s], [m.prefix for m in s],
                             [m.length for m in s])

    @classmethod
    def from_payload(cls, payload: Payload, lsn: int | None = None) -> Forward:
        """A FORWARD body back to a Forward; CorruptRecordError (naming the LSN) when malformed."""
        try:
            rids, pre, n = list(payload["rids"]), list(payload["pre"]), list(payload["n"])
            seq, mode, q = payload["seq"], payload["mode"], payload["q"]
        except (KeyError, TypeError) as exc:
            raise CorruptRecordError(f"FORWARD payload malformed ({exc!r})", lsn) from None
        ok = (isinstance(seq, int) and isinstance(q, int) and mode in FORWARD_MODES and len(rids) == len(pre) == len(n)
              and all(isinstance(r, str) for r in rids) and all(isinstance(x, int) and x >= 0 for x in pre + n))
        if not ok:
            raise CorruptRecordError("FORWARD payload has fields of the wrong types or lengths", lsn)
        return cls(seq, mode, q, tuple(Segment(r, p, k) for r, p, k in zip(rids, pre, n)))


def forward_entry(seq: int, mode: str, pending: int, rids: list[str], prefixes: list[int],
                  lengths: list[int]) -> Entry:
    """The FORWARD record. Parallel arrays, not one small array per member: fewer objects to pack
    on the scheduler's path, which runs once per forward."""
    return Entry(Kind.FORWARD, None, {"seq": seq, "mode": mode, "q": pending, "rids": rids, "pre": prefixes,
                                      "n": lengths})


def engine_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What SERVER_START records under `engine`: only the known keys, so the format stays written down."""
    unknown = sorted(set(settings) - set(ENGINE_KEYS))
    if unknown:
        raise ValueError(f"unknown engine setting(s) {unknown}; add them to ENGINE_KEYS and FORMAT.md")
    return dict(settings)
