"""Scheduling limits and step statistics."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from server.forward_batch import ForwardMode


@dataclass(frozen=True, slots=True)
class SchedulePolicy:
    max_running_requests: int
    chunked_prefill_size: int  # <= 0: no chunking
    max_prefill_tokens: int
    context_len: int
    overlap: bool = True
    mixed_chunk: bool = False  # a prefill chunk's forward also carries the running decodes

    @property
    def prefill_budget(self) -> int:
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens

    @property
    def future_slots(self) -> int:
        # At most two batches' tokens are unresolved at once (launched N+1, pending N).
        return 4 * self.max_running_requests + 16


@dataclass(slots=True)
class StepStats:
    """Cumulative step counts, tokens and seconds per forward mode (benchmarks, metrics)."""

    steps: dict[ForwardMode, int] = field(default_factory=lambda: dict.fromkeys(ForwardMode, 0))
    tokens: dict[ForwardMode, int] = field(default_factory=lambda: dict.fromkeys(ForwardMode, 0))
    seconds: dict[ForwardMode, float] = field(default_factory=lambda: dict.fromkeys(ForwardMode, 0.0))

    def record(self, mode: ForwardMode, tokens: int, seconds: float) -> None:
        self.steps[mode] += 1
        self.tokens[mode] += tokens
        self.seconds[mode] += seconds


@dataclass(slots=True)
class SchedulerCounters:
    """Counts for metrics; the sample lists are drained by whoever reports them."""

    aborts: Counter[str] = field(default_factory=Counter)  # by source
    discarded_results: int = 0
    generated_tokens: int = 0
    prefix_query_tokens: int = 0  # prompt tokens of admitted requests
    prefix_hit_tokens: int = 0  # of those, served from the prefix cache
    step_seconds: list[float] = field(default_factory=list)
    wal_commit_seconds: list[float] = field(default_factory=list)  # appended on the log writer's thread

    def drain_samples(self) -> tuple[list[float], list[float]]:
        steps, self.step_seconds = self.step_seconds, []
        wal, self.wal_commit_seconds = self.wal_commit_seconds, []
        return steps, wal
