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
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from commitlog import Ledger
from ops.bench_offline import Workload, make_workload


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


def one_run(model_dir: Path, work: Workload, durability: str) -> tuple[float, int]:
    """Output tok/s, and the size of the log it wrote."""
    from server import Engine

    params = [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in work.output_lens]
    with tempfile.TemporaryDirectory(prefix="tokenledger-bench-") as log_dir:
        engine = Engine(model_path=str(model_dir), max_total_tokens=65536, max_running_requests=64,
                        log_dir=log_dir, log_durability=durability)
        try:
            engine.generate(input_ids=work.prompts[:4], sampling_params=params[:4])  # warm-up
            started = time.perf_counter()
            engine.generate(input_ids=work.prompts, sampling_params=params)
            elapsed = time.perf_counter() - started
        finally:
            engine.shutdown()
        size = (Path(log_dir) / "data.mdb").stat().st_size
    return work.output_tokens / elapsed, size


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-path", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--log-durability", default="fsync")
    args = p.parse_args(argv)
    from server.models.demo import model_dir_for
    from server.models.loader import load_model

    model_dir = model_dir_for(args.model_path)
    vocab = load_model(model_dir).config.vocab_size
    work = make_workload(args.num_prompts, (16, 256), (16, 96), vocab, set(), 0)
    tps: dict[bool, list[float]] = {True: [], False: []}
    timings: list[float] = []
    step_seconds = 0.0
    for _ in range(args.rounds):
        for enabled in (False, True):  # alternating: drift on a shared machine hits both alike
            with schedule_records(enabled, timings if enabled else []):
                started = time.perf_counter()
                rate, _ = one_run(model_dir, work, args.log_durability)
                step_seconds += (time.perf_counter() - started) if enabled else 0.0
            tps[enabled].append(rate)
    off, on = statistics.median(tps[False]), statistics.median(tps[True])
    print(json.dumps({
        "tok_s_without": round(off, 1), "tok_s_with": round(on, 1), "throughput_cost_pct": round(100 * (1 - on / off), 2),
        "runs_without": [round(x, 1) for x in tps[False]], "runs_with": [round(x, 1) for x in tps[True]],
        "forwards_logged": len(timings), "us_per_forward_record": round(1e6 * statistics.mean(timings), 2),
        "record_time_pct_of_runs": round(100 * sum(timings) / step_seconds, 3),
    }))


if __name__ == "__main__":
    main()
