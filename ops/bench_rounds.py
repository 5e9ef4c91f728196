"""Interleaved measurement rounds shared by the offline throughput benchmarks."""
from __future__ import annotations

import time
from typing import Any


def measure_interleaved(engines: dict[str, Any], prompts: list[list[int]], params: dict[str, dict[str, Any]],
                        rounds: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Runs every engine once per round (A B C, A B C, ...) so machine noise spreads over all of
    them; returns tokens/s per round and tokens per round, by name. Shuts the engines down."""
    rates: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, int] = {}
    try:
        for name, engine in engines.items():
            engine.generate(input_ids=prompts[:4], sampling_params=params[name])  # warm-up (and compile)
        for _ in range(rounds):
            for name, engine in engines.items():
                started = time.perf_counter()
                outs = engine.generate(input_ids=prompts, sampling_params=params[name])
                tokens[name] = sum(len(o["output_ids"]) for o in outs)
                rates[name].append(tokens[name] / (time.perf_counter() - started))
    finally:
        for engine in engines.values():
            engine.shutdown()
    return rates, tokens
