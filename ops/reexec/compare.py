"""What re-execution found per request, and the comparison of one recomputed value with the logged one.

Bit for bit means equal float64 bit patterns (the log stores float64; the engine's float32 values
widen exactly). `--isolated` allows LOGPROB_TOLERANCE and names a greedy tie instead of a divergence.
"""
from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field

# --isolated: a request re-run alone meets other batch shapes, so float sums run in another order.
# Absolute, on natural-log probabilities: far above fp32 reordering noise (~1e-6 on the test models),
# far below any real change of weights or inputs.
LOGPROB_TOLERANCE = 1e-4


class Status(enum.Enum):
    PROVEN = "proven"
    DIVERGED = "diverged"
    NOT_REEXECUTABLE = "not re-executable"


@dataclass(frozen=True, slots=True)
class Divergence:
    position: int  # output position k (0-based); for an input logprob, the prompt position
    what: str  # "token", "logprob", "top logprobs", "input logprob", "outcome"
    logged: object
    recomputed: object

    def describe(self) -> str:
        where = "prompt position" if self.what == "input logprob" else "output position"
        return f"{self.what} at {where} {self.position}: logged {self.logged!r}, recomputed {self.recomputed!r}"


@dataclass(slots=True)
class Finding:
    """One incarnation's verdict as it builds up during the run."""

    rid: str
    incarnation: int
    status: Status = Status.PROVEN
    divergence: Divergence | None = None
    reason: str | None = None  # not re-executable: why
    tokens_checked: int = 0
    logprobs_checked: int = 0
    discarded_rerun: int = 0  # results the log discarded whose forward was re-run
    ties: list[int] = field(default_factory=list)  # --isolated: greedy ties, by output position

    def diverge(self, divergence: Divergence) -> None:
        if self.divergence is None:  # the first one is the one to report; later ones follow from it
            self.status, self.divergence = Status.DIVERGED, divergence

    def exclude(self, reason: str) -> None:
        self.status, self.reason = Status.NOT_REEXECUTABLE, reason


def same_bits(a: float, b: float) -> bool:
    return struct.pack(">d", a) == struct.pack(">d", b)


def close(a: float, b: float, tolerance: float) -> bool:
    if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
        return same_bits(a, b)
    return abs(a - b) <= tolerance


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How recomputed values must match: exactly (the logged schedule), or within a bound (--isolated)."""

    isolated: bool

    def equal(self, logged: float, recomputed: float) -> bool:
        return close(logged, recomputed, LOGPROB_TOLERANCE) if self.isolated else same_bits(logged, recomputed)
