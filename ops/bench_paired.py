"""Paired A/B rounds: the cost of one setting (WAL fsync) against another (none), drift cancelled.

Rounds of one configuration spread ±20 % on a shared machine, so comparing medians of
separate rounds cannot resolve a few percent. Here each pair runs A and B back to back
(order ABBA, BAAB, ... so that a drift or a first-in-pair effect hits both alike) and yields
one ratio B/A; the figure is the median ratio with a distribution-free (sign-test) interval.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PairedCost:
    """`cost` = 1 - median(B/A) over the pairs (positive: B is slower); `low`/`high` bound it."""

    ratios: list[float]
    median_ratio: float
    low: float
    high: float
    confidence: float

    @property
    def cost(self) -> float:
        return 1 - self.median_ratio

    @property
    def cost_low(self) -> float:
        return 1 - self.high

    @property
    def cost_high(self) -> float:
        return 1 - self.low

    def verdict(self, budget: float) -> str:
        if self.cost_high < budget:
            return f"below {budget:.0%}: shown"
        if self.cost_low >= budget:
            return f"at or above {budget:.0%}: shown"
        return f"the interval straddles {budget:.0%}: not shown either way (run more pairs)"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Distribution-free interval for the median (the sign test's order statistics).

    Returns (low, high, achieved confidence): the k-th smallest and k-th largest value for the
    largest k with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. Needs n >= 6 for 95 %;
    with fewer it returns (min, max) and the confidence that actually holds."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no values")
    tail = 0.0  # P(Binomial(n, 1/2) < k), for the current k
    k = 0
    while k + 1 <= n // 2:
        next_tail = tail + math.comb(n, k) / 2 ** n
        if next_tail > (1 - confidence) / 2:
            break
        tail, k = next_tail, k + 1
    k = max(k, 1)
    achieved = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    return ordered[k - 1], ordered[n - k], achieved


def paired_cost(pairs: list[tuple[float, float]], confidence: float = 0.95) -> PairedCost:
    """`pairs` of (rate A, rate B) measured back to back; the ratio is B/A per pair."""
    ratios = [b / a for a, b in pairs]
    low, high, achieved = median_interval(ratios, confidence)
    return PairedCost(ratios, statistics.median(ratios), low, high, achieved)


def waited_cost(none_runs: list[LogTime], fsync_runs: list[LogTime], confidence: float = 0.95) -> PairedCost:
    """The part of the cost that goes through waiting on the log: per pair, the extra time the fsync
    run waited (queue + tail) as a share of its wall time; low-noise, but blind to anything else
    (CPU the kernel spends on the syncs). Reported as a ratio 1 - share, so `cost` reads the same."""
    ratios = [1 - (f.waited_seconds - n.waited_seconds) / f.wall_seconds for n, f in zip(none_runs, fsync_runs)]
    low, high, achieved = median_interval(ratios, confidence)
    return PairedCost(ratios, statistics.median(ratios), low, high, achieved)


def pair_order(index: int) -> tuple[int, int]:
    """ABBA BAAB...: pair i runs A first when i % 4 in (0, 3), so each block of 4 pairs is balanced."""
    return (0, 1) if index % 4 in (0, 3) else (1, 0)


def measure_pairs(run_a: Callable[[], float], run_b: Callable[[], float], num_pairs: int) -> list[tuple[float, float]]:
    """`num_pairs` (rate A, rate B) pairs, the order within each pair alternating (`pair_order`)."""
    runs = (run_a, run_b)
    pairs = []
    for i in range(num_pairs):
        rates = [0.0, 0.0]
        for which in pair_order(i):
            rates[which] = runs[which]()
        pairs.append((rates[0], rates[1]))
    return pairs


@dataclass(frozen=True, slots=True)
class LogTime:
    """What one run spent in the log's writer (the deltas of `WriterStats` over the run)."""

    num_txns: int
    num_groups: int
    write_seconds: float
    max_write_seconds: float
    back_pressure_seconds: float
    tail_seconds: float  # the last group's flush -> durable: what the caller waited after the last step
    wall_seconds: float

    @property
    def waited_seconds(self) -> float:
        """Time the caller spent waiting on the log: blocked on a full queue, plus the tail."""
        return self.back_pressure_seconds + self.tail_seconds

    def row(self) -> str:
        mean_ms = 1e3 * self.write_seconds / max(1, self.num_txns)
        return (f"{self.num_txns:4d}/{self.num_groups:<4d} {mean_ms:6.2f} {1e3 * self.max_write_seconds:7.2f} "
                f"{self.back_pressure_seconds:6.3f} {1e3 * self.tail_seconds:6.2f}")


def tokens_per_s(engine: Any, prompts: list[list[int]], params: dict[str, Any],
                 log_times: list[LogTime]) -> Callable[[], float]:
    """One timed `generate` of the whole workload: output tokens per wall second; appends the
    run's `LogTime` to `log_times`."""
    stats = engine.scheduler.ledger.writer.stats
    commit_latencies = engine.scheduler.counters.wal_commit_seconds

    def run() -> float:
        before = (stats.num_txns, stats.num_groups, stats.write_seconds, stats.back_pressure_seconds)
        stats.max_write_seconds = 0.0
        started = time.perf_counter()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        wall = time.perf_counter() - started
        rate = sum(len(o["output_ids"]) for o in outs) / wall
        log_times.append(LogTime(stats.num_txns - before[0], stats.num_groups - before[1],
                                 stats.write_seconds - before[2], stats.max_write_seconds,
                                 stats.back_pressure_seconds - before[3], commit_latencies[-1], wall))
        return rate
    return run
