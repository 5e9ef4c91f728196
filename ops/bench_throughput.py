"""`tokenledger bench throughput`: one offline workload under overlap on/off × WAL fsync/none.

Configurations are interleaved round by round (A B C D, A B C D, ...) so that machine
noise spreads over all of them; the figure per configuration is its median round.
The last line is one JSON object with every figure.

`--paired N` measures issue 11's target instead: WAL fsync against none, one overlap setting,
in N back-to-back pairs (ops.bench_paired), and states the cost with its 95 % interval.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from typing import Any

from ops.bench_paired import LogTime, measure_pairs, paired_cost, tokens_per_s, waited_cost
from ops.bench_rounds import measure_interleaved

CONFIGS = (
    ("overlap+fsync", {"disable_overlap_schedule": False, "log_durability": "fsync"}),
    ("overlap+none", {"disable_overlap_schedule": False, "log_durability": "none"}),
    ("no-overlap+fsync", {"disable_overlap_schedule": True, "log_durability": "fsync"}),
    ("no-overlap+none", {"disable_overlap_schedule": True, "log_durability": "none"}),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("throughput", help="offline tokens/s: overlap on/off x WAL fsync/none")
    p.add_argument("--model-path", default=None, help="model directory (default: the demo model)")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunked-prefill-size", type=int, default=256)
    p.add_argument("--num-threads", type=int, default=None, help="compute threads of the forward (default: every core)")
    p.add_argument("--paired", type=int, default=0, metavar="N",
                   help="instead of the table: N back-to-back pairs of fsync vs none (overlap on unless "
                        "--disable-overlap-schedule); prints the cost of fsync with its 95%% interval")
    p.add_argument("--disable-overlap-schedule", action="store_true", help="with --paired: pair without overlap")
    p.add_argument("--budget", type=float, default=0.03, help="with --paired: the cost the verdict is checked against")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    prompts = [[(13 * i + j) % 1000 + 5 for j in range(16 + (i * 37) % 200)] for i in range(args.requests)]
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}
    if args.paired:
        return run_paired(args, prompts, params)
    with tempfile.TemporaryDirectory(prefix="tokenledger-bench-") as root:
        engines = {name: _engine(args, f"{root}/{i}", cfg) for i, (name, cfg) in enumerate(CONFIGS)}
        rates, _ = measure_interleaved(engines, prompts, {name: params for name in engines}, args.rounds)
    figures = {name: statistics.median(r) for name, r in rates.items()}
    base = figures["overlap+none"]
    print(f"{'config':18} {'tokens/s':>10} {'vs overlap+none':>16}")
    for name, rate in figures.items():
        print(f"{name:18} {rate:10.1f} {rate / base:16.3f}")
    print(json.dumps({"tokens_per_s": figures, "rounds": rates}))
    return 0


def _engine(args: argparse.Namespace, log_dir: str, cfg: dict[str, Any]) -> Any:
    from server import Engine

    return Engine(model_path=args.model_path, max_total_tokens=65536, max_running_requests=64,
                  chunked_prefill_size=args.chunked_prefill_size, num_threads=args.num_threads, log_dir=log_dir,
                  **cfg)


def run_paired(args: argparse.Namespace, prompts: list[list[int]], params: dict[str, Any]) -> int:
    """A = durability none, B = fsync, same overlap setting; cost = 1 - median(B/A) over the pairs."""
    overlap = "no-overlap" if args.disable_overlap_schedule else "overlap"
    with tempfile.TemporaryDirectory(prefix="tokenledger-bench-") as root:
        engines = [_engine(args, f"{root}/{mode}", {"disable_overlap_schedule": args.disable_overlap_schedule,
                                                     "log_durability": mode}) for mode in ("none", "fsync")]
        try:
            for engine in engines:
                engine.generate(input_ids=prompts[:4], sampling_params=params)  # warm-up (and compile)
            log_times: tuple[list[LogTime], list[LogTime]] = ([], [])
            none_run, fsync_run = (tokens_per_s(e, prompts, params, t) for e, t in zip(engines, log_times))
            pairs = measure_pairs(none_run, fsync_run, args.paired)
        finally:
            for engine in engines:
                engine.shutdown()
    result = paired_cost(pairs)
    print(f"{overlap}: WAL fsync vs none, {len(pairs)} pairs (order ABBA BAAB ...)")
    print("log columns, fsync run: write txns/groups, mean and max ms per txn (commit + fsync), seconds blocked "
          "on a full queue, ms from the last flush to durable (tail); last columns: the same for the none run")
    print(f"{'pair':>4} {'none tok/s':>11} {'fsync tok/s':>12} {'fsync/none':>11}  {'txn/grp':9} {'mean':>6} "
          f"{'max':>7} {'block':>6} {'tail':>6}  {'txn/grp':9} {'mean':>6} {'max':>7} {'block':>6} {'tail':>6}")
    for i, ((none, fsync), ratio) in enumerate(zip(pairs, result.ratios)):
        print(f"{i:4d} {none:11.1f} {fsync:12.1f} {ratio:11.3f}  {log_times[1][i].row()}  {log_times[0][i].row()}")
    print(f"cost of fsync: {100 * result.cost:.2f}% (median of pair ratios), "
          f"{100 * result.confidence:.1f}% interval [{100 * result.cost_low:.2f}%, {100 * result.cost_high:.2f}%]; "
          f"{result.verdict(args.budget)}")
    waited = waited_cost(*log_times)
    print(f"of which waiting on the log (queue + tail, fsync minus none): {100 * waited.cost:.2f}%, "
          f"{100 * waited.confidence:.1f}% interval [{100 * waited.cost_low:.2f}%, {100 * waited.cost_high:.2f}%]")
    print(json.dumps({"overlap": not args.disable_overlap_schedule, "pairs": pairs,
                      "median_ratio": result.median_ratio, "cost": result.cost,
                      "cost_interval": [result.cost_low, result.cost_high], "confidence": result.confidence,
                      "waited_cost": waited.cost, "waited_cost_interval": [waited.cost_low, waited.cost_high]}))
    return 0
