"""`tokenledger bench throughput`: one offline workload under overlap on/off × WAL fsync/none.

Configurations are interleaved round by round (A B C D, A B C D, ...) so that machine
noise spreads over all of them; the figure per configuration is its median round.
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile

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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from server import Engine

    prompts = [[(13 * i + j) % 1000 + 5 for j in range(16 + (i * 37) % 200)] for i in range(args.requests)]
    params = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}
    with tempfile.TemporaryDirectory(prefix="tokenledger-bench-") as root:
        engines = {name: Engine(model_path=args.model_path, max_total_tokens=65536, max_running_requests=64,
                                chunked_prefill_size=args.chunked_prefill_size, log_dir=f"{root}/{i}", **cfg)
                   for i, (name, cfg) in enumerate(CONFIGS)}
        rates, _ = measure_interleaved(engines, prompts, {name: params for name in engines}, args.rounds)
    figures = {name: statistics.median(r) for name, r in rates.items()}
    base = figures["overlap+none"]
    print(f"{'config':18} {'tokens/s':>10} {'vs overlap+none':>16}")
    for name, rate in figures.items():
        print(f"{name:18} {rate:10.1f} {rate / base:16.3f}")
    print(json.dumps({"tokens_per_s": figures, "rounds": rates}))
    return 0
