"""`tokenledger bench checkpoint`: random-weight checkpoints of the shapes the speed benchmarks
use (nothing is downloaded), each with a tokenizer, loadable by tokenledger, HF and vLLM alike."""
from __future__ import annotations

import argparse
from pathlib import Path

PRESETS = {
    # The online/offline comparison model: small enough that serving overhead, not GEMMs, dominates.
    "tiny": dict(vocab_size=1024, hidden_size=128, intermediate_size=352, num_layers=3, num_heads=4, num_kv_heads=2),
    # A GEMM-bound Llama: the forward's matmuls dominate.
    "gemm": dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816, num_layers=8, num_heads=16,
                 num_kv_heads=4),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("checkpoint", help="write a random-weight Llama checkpoint of a benchmark shape")
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from server.models.demo import CheckpointSpec, build_checkpoint

    spec = CheckpointSpec(architecture="LlamaForCausalLM", max_position_embeddings=4096, initializer_range=0.08,
                          **PRESETS[args.preset])  # type: ignore[arg-type]
    out = build_checkpoint(Path(args.out), spec)
    print(out)
    return 0
