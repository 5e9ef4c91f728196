"""`tokenledger bench engine`: offline prefill and decode throughput on a model (demo by default).

Prints one row per measurement and, as its last line, one JSON object with every figure.
"""
from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="offline prefill / decode tokens per second")
    p.add_argument("--model-path", default=None, help="model directory (default: the demo model)")
    p.add_argument("--batch-sizes", default="1,8,32", help="decode batch sizes, comma separated")
    p.add_argument("--decode-tokens", type=int, default=64, help="new tokens per request in the decode runs")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt length of the prefill run")
    p.add_argument("--prefill-requests", type=int, default=8)
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from server import Engine

    sizes = [int(s) for s in args.batch_sizes.split(",")]
    engine = Engine(model_path=args.model_path, max_total_tokens=65536, max_running_requests=max(sizes + [8]),
                    chunked_prefill_size=-1, disable_overlap_schedule=args.disable_overlap_schedule)
    try:
        figures = {"prefill_tokens_per_s": _prefill(engine, args.prompt_len, args.prefill_requests)}
        print(f"prefill  {args.prefill_requests} x {args.prompt_len} tokens: {figures['prefill_tokens_per_s']:9.0f} tok/s")
        for b in sizes:
            rate = _decode(engine, b, args.decode_tokens)
            figures[f"decode_tokens_per_s_batch_{b}"] = rate
            print(f"decode   batch {b:3d}: {rate:9.0f} tok/s")
    finally:
        engine.shutdown()
    print(json.dumps(figures))
    return 0


def _prefill(engine, prompt_len: int, n: int) -> float:
    # torch: imported only when a benchmark really runs
    from server.forward_batch import ForwardMode

    prompts = [[(7 * i + j) % 1000 + 5 for j in range(prompt_len)] for i in range(n)]
    engine.generate(input_ids=prompts[:1], sampling_params={"max_new_tokens": 1})  # warm-up
    stats = engine.scheduler.stats
    before_t, before_n = stats.seconds[ForwardMode.EXTEND], stats.tokens[ForwardMode.EXTEND]
    engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 1})
    return (stats.tokens[ForwardMode.EXTEND] - before_n) / (stats.seconds[ForwardMode.EXTEND] - before_t)


def _decode(engine, batch: int, new_tokens: int) -> float:
    from server.forward_batch import ForwardMode

    prompts = [[(11 * i + j) % 1000 + 5 for j in range(16)] for i in range(batch)]
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    stats = engine.scheduler.stats
    before_t, before_n = stats.seconds[ForwardMode.DECODE], stats.tokens[ForwardMode.DECODE]
    engine.generate(input_ids=prompts, sampling_params=params)
    return (stats.tokens[ForwardMode.DECODE] - before_n) / (stats.seconds[ForwardMode.DECODE] - before_t)
