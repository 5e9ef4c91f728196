"""Decode tok/s on a CUDA device, per attention backend and batch size, for ops/gpu_check.py.

One random-weight Llama (hidden 1024, 8 layers, GQA 16/8, head_dim 64, fp16: the one half dtype
the checks compile FlashInfer for) built locally, driven through the offline `Engine` with the
log's durability `none` (the WAL's fsync is not what this measures). Decode rate = B * (N2 - N1) / (t(N2) - t(N1)): two greedy runs of the same B prompts
that differ only in new tokens, so prefill and start-up cancel out. Prints one JSON line per cell.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PROMPT_LEN = 32
SHORT, LONG = 16, 80  # new tokens of the two timed runs


@dataclass(frozen=True, slots=True)
class Cell:
    backend: str
    batch: int
    tok_s: float | None
    error: str | None = None


def build_model(out: Path) -> Path:
    from server.models.demo import CheckpointSpec, build_checkpoint

    spec = CheckpointSpec(architecture="LlamaForCausalLM", vocab_size=2048, hidden_size=1024, intermediate_size=2816,
                          num_layers=8, num_heads=16, num_kv_heads=8, head_dim=64, max_position_embeddings=4096,
                          initializer_range=0.02, seed=7)
    return build_checkpoint(out, spec)


def _timed(engine, batch: int, new_tokens: int) -> float:
    prompts = [[(7 * i + j) % 1000 + 10 for j in range(PROMPT_LEN)] for i in range(batch)]
    params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return time.perf_counter() - started


def measure(model_dir: Path, backend: str, batches: list[int]) -> list[Cell]:
    from server import Engine

    largest = max(batches)
    engine = Engine(model_path=str(model_dir), device="cuda", attention_backend=backend, dtype="float16",
                    max_running_requests=largest, max_total_tokens=largest * (PROMPT_LEN + LONG) + 256,
                    chunked_prefill_size=largest * PROMPT_LEN, log_durability="none", disable_radix_cache=True)
    try:
        _timed(engine, 2, LONG)  # warm-up: kernel compilation and the allocator's first blocks
        cells = []
        for batch in batches:
            short, long = _timed(engine, batch, SHORT), _timed(engine, batch, LONG)
            cells.append(Cell(backend, batch, batch * (LONG - SHORT) / max(long - short, 1e-9)))
        return cells
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backends", nargs="+", default=["torch", "triton", "flashinfer"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32, 128])
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tl-gpu-bench-") as tmp:
        model_dir = build_model(Path(tmp) / "model")
        for backend in args.backends:
            try:
                cells = measure(model_dir, backend, args.batches)
            except Exception as exc:  # one backend's failure is reported in its cells; the others still run
                cells = [Cell(backend, b, None, f"{type(exc).__name__}: {exc}") for b in args.batches]
            for cell in cells:
                print(json.dumps(asdict(cell)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
