"""What the schedule records (one FORWARD per launched forward, issue 14) cost on offline throughput:
the same greedy workload through the offline `Engine`, rounds alternating with the records on and
off (off: `Ledger.log_forward` replaced by a no-op in this process only), plus the time the records
take per forward, measured directly. Prints one JSON line.

    python -m ops.bench_schedule_cost [--model-path P] [--rounds 3] [--num-prompts 32]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from commitlog import Ledger
from ops.bench_offline import Workload, make_workload, warmed_engine


@contextmanager
def schedule_records(enabled: bool, timings: list[float]) -> Iterator[None]:
    """On: the real `log_forward`, timed per call. Off: a no-op (what the scheduler cost before)."""
    original = Ledger.log_forward

    def timed(self: Ledger, *args: Any) -> int:
        started = time.perf_counter()
        seq = original(self, *args)
        timings.append(time.perf_counter() - started)
        return seq

    Ledger.log_forward = timed if enabled else (lambda self, *args: 0)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Ledger.log_forward = original  # type: ignore[method-assign]


def one_run(model_dir: Path, work: Workload, durability: str) -> tuple[float, float]:
    """Output tokens per wall second and per CPU second of this process (all its threads): on a
    machine shared with other work, CPU time is what the records can change, wall time is noise."""
    with warmed_engine(model_dir, work, durability) as (engine, params):
        started, cpu_started = time.perf_counter(), time.process_time()
        engine.generate(input_ids=work.prompts, sampling_params=params)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return work.output_tokens / elapsed, work.output_tokens / cpu


def encode_cost_us(members: int, repeats: int = 20000) -> float:
    """The rest of a FORWARD's cost on the scheduler thread: encoding (msgpack, CRC, hash chain) at flush."""
    from commitlog import Encoder
    from commitlog.schedule import forward_entry

    entry = forward_entry(1, "decode", 1, [f"req-{i:08x}" for i in range(members)], list(range(300, 300 + members)),
                          [1] * members)
    encoder = Encoder()
    started = time.perf_counter()
    for _ in range(repeats):
        encoder.encode([entry])
    return 1e6 * (time.perf_counter() - started) / repeats


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--log-durability", default="fsync")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    from transformers import AutoTokenizer

    from server.models.demo import model_dir_for

    model_dir = model_dir_for(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    work = make_workload(args.num_prompts, (16, 256), (16, 96), tokenizer.vocab_size,
                         set(tokenizer.all_special_ids), 0)
    tps: dict[bool, list[float]] = {True: [], False: []}
    per_cpu: dict[bool, list[float]] = {True: [], False: []}
    timings: list[float] = []
    run_seconds = 0.0
    for round_ in range(args.rounds):
        # ABBA order: a drift on a shared machine (or a first-run effect) hits both alike.
        for enabled in ((False, True) if round_ % 2 == 0 else (True, False)):
            with schedule_records(enabled, timings if enabled else []):
                rate, cpu_rate = one_run(model_dir, work, args.log_durability)
            tps[enabled].append(rate)
            per_cpu[enabled].append(cpu_rate)
            run_seconds += work.output_tokens / rate if enabled else 0.0
    off, on = statistics.median(tps[False]), statistics.median(tps[True])
    ratios = [b / a for a, b in zip(tps[False], tps[True])]
    cpu_off, cpu_on = statistics.median(per_cpu[False]), statistics.median(per_cpu[True])
    encode_us = encode_cost_us(args.num_prompts)
    print(json.dumps({
        "tok_per_cpu_s_without": round(cpu_off, 1), "tok_per_cpu_s_with": round(cpu_on, 1),
        "cpu_cost_pct": round(100 * (1 - cpu_on / cpu_off), 2),
        "cpu_runs_without": [round(x, 1) for x in per_cpu[False]], "cpu_runs_with": [round(x, 1) for x in per_cpu[True]],
        "tok_s_without": round(off, 1), "tok_s_with": round(on, 1), "throughput_cost_pct": round(100 * (1 - on / off), 2),
        "runs_without": [round(x, 1) for x in tps[False]], "runs_with": [round(x, 1) for x in tps[True]],
        "cost_pct_median_of_pairs": round(100 * (1 - statistics.median(ratios)), 2),
        "forwards_logged": len(timings), "us_per_forward_record": round(1e6 * statistics.mean(timings), 2),
        f"us_to_encode_a_{args.num_prompts}_member_forward": round(encode_us, 2),
        # Upper bound of the records' time on the scheduler thread: staging, plus encoding every
        # forward as if it had every request in it, over the timed generate calls.
        "record_time_pct_of_runs": round(100 * (sum(timings) + len(timings) * encode_us * 1e-6) / run_seconds, 3),
    }))


if __name__ == "__main__":
    main()
