"""`tokenledger bench grammar`: constrained vs unconstrained decoding on one workload.

The same prompts run four ways: unconstrained, and under a regex that cannot complete within
`--max-new-tokens` (so every request decodes exactly as many tokens as unconstrained), each
with overlap on and off. A constrained request never decodes while its previous token is
pending, so with overlap on the scheduler processes results early for it: the overlap rows
show what that costs. Rounds are interleaved; the figure is the median round.
The last line is one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from ops.bench_rounds import measure_interleaved

# Lower-case text of a fixed, long length: never complete within the token budget.
LONG_REGEX = r"[a-z ,.]{4000}"
CONFIGS = (
    ("unconstrained+overlap", False, False),
    ("regex+overlap", True, False),
    ("unconstrained+no-overlap", False, True),
    ("regex+no-overlap", True, True),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grammar", help="offline tokens/s: constrained (regex) vs unconstrained, overlap on/off")
    p.add_argument("--model-path", default=None, help="model directory (default: the demo model)")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from server import Engine

    prompts = [[(13 * i + j) % 1000 + 5 for j in range(16 + (i * 37) % 100)] for i in range(args.requests)]
    base = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}
    with tempfile.TemporaryDirectory(prefix="tokenledger-bench-grammar-") as root:
        engines = {name: Engine(model_path=args.model_path, max_total_tokens=65536, max_running_requests=64,
                                log_durability="none", disable_overlap_schedule=no_overlap, log_dir=f"{root}/{i}")
                   for i, (name, _, no_overlap) in enumerate(CONFIGS)}
        params = {name: base | ({"regex": LONG_REGEX} if constrained else {}) for name, constrained, _ in CONFIGS}
        rates, tokens = measure_interleaved(engines, prompts, params, args.rounds)
    figures = {name: statistics.median(r) for name, r in rates.items()}
    ref = figures["unconstrained+overlap"]
    print(f"{'config':26} {'tokens/s':>10} {'vs unconstrained+overlap':>26} {'tokens/round':>13}")
    for name, rate in figures.items():
        print(f"{name:26} {rate:10.1f} {rate / ref:26.3f} {tokens[name]:13d}")
    print(json.dumps({"tokens_per_s": figures, "rounds": rates, "tokens_per_round": tokens}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="bench_grammar", description=__doc__)
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    ns = parser.parse_args(["grammar"] + __import__("sys").argv[1:])
    raise SystemExit(ns.run(ns))
