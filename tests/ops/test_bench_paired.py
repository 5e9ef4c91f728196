"""`bench throughput --paired`: the pair order cancels drift, and the interval for the median pair
ratio is the sign test's (its coverage is what it says), so the stated cost can be trusted."""
from __future__ import annotations

import math
import random

import pytest

from ops.bench_paired import LogTime, measure_pairs, median_interval, pair_order, paired_cost, waited_cost


def test_median_interval_takes_the_sign_test_order_statistics() -> None:
    # Textbook ranks (1-based) for 95 %: n=10 -> 2..9, n=20 -> 6..15, n=30 -> 10..21.
    for n, (lo, hi) in {10: (2, 9), 20: (6, 15), 30: (10, 21)}.items():
        low, high, achieved = median_interval([float(v) for v in range(1, n + 1)])
        assert (low, high) == (lo, hi)
        k = lo
        assert achieved == pytest.approx(1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n)
        assert achieved >= 0.95


def test_median_interval_with_too_few_values_is_min_to_max_and_says_its_lower_confidence() -> None:
    low, high, achieved = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (low, high) == (1.0, 5.0) and achieved == pytest.approx(1 - 2 / 32)


def test_median_interval_covers_the_true_median_at_least_as_often_as_stated() -> None:
    rng = random.Random(7)
    trials, covered = 2000, 0
    for _ in range(trials):
        low, high, _ = median_interval([rng.gauss(1.0, 0.15) for _ in range(20)])
        covered += low <= 1.0 <= high
    assert covered / trials >= 0.94


def test_pair_order_is_abba_baab_so_a_linear_drift_cancels() -> None:
    assert [pair_order(i) for i in range(4)] == [(0, 1), (1, 0), (1, 0), (0, 1)]
    clock = iter(range(1000))
    # Each run's rate falls with time (drift); A and B are the same workload, so the ratio must be 1.
    pairs = measure_pairs(lambda: 100.0 - next(clock), lambda: 100.0 - next(clock), 8)
    a_sum, b_sum = sum(a for a, _ in pairs), sum(b for _, b in pairs)
    assert a_sum == b_sum


def test_paired_cost_is_one_minus_the_median_ratio_with_its_interval() -> None:
    pairs = [(100.0, 100.0 * r) for r in (0.90, 0.95, 0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03, 1.05)]
    result = paired_cost(pairs)
    assert result.median_ratio == pytest.approx(0.995)
    assert result.cost == pytest.approx(0.005)
    assert (result.cost_low, result.cost_high) == (pytest.approx(1 - 1.03), pytest.approx(1 - 0.95))
    assert result.verdict(0.03).startswith("the interval straddles")
    assert paired_cost([(100.0, 99.0 + 0.01 * i) for i in range(10)]).verdict(0.03) == "below 3%: shown"
    assert paired_cost([(100.0, 90.0 + 0.01 * i) for i in range(10)]).verdict(0.03) == "at or above 3%: shown"


def test_waited_cost_is_the_extra_queue_and_tail_wait_of_the_fsync_run_over_its_wall_time() -> None:
    def run(block: float, tail: float) -> LogTime:
        return LogTime(10, 10, 0.05, 0.01, block, tail, wall_seconds=2.0)

    none = [run(0.0, 0.001)] * 6
    fsync = [run(0.0, 0.021)] * 3 + [run(0.04, 0.021)] * 3  # +20 ms tail; half also +40 ms blocked
    result = waited_cost(none, fsync)
    assert sorted(result.ratios) == pytest.approx([0.97] * 3 + [0.99] * 3)
    assert result.cost == pytest.approx(0.02) and result.cost_high == pytest.approx(0.03)


def test_bench_throughput_paired_states_the_cost_of_fsync_with_its_interval(tiny_checkpoint) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    ran = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "throughput", "--model-path", str(tiny_checkpoint("llama")),
         "--requests", "4", "--max-new-tokens", "3", "--paired", "2"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    figures = json.loads(ran.stdout.strip().splitlines()[-1])
    assert figures["overlap"] is True and len(figures["pairs"]) == 2
    low, high = figures["cost_interval"]
    assert low <= figures["cost"] <= high
    assert "cost of fsync:" in ran.stdout and "interval" in ran.stdout
    assert figures["waited_cost_interval"][0] <= figures["waited_cost"] <= figures["waited_cost_interval"][1]
