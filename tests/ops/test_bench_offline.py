"""`tokenledger bench offline` runs its workload through the Engine and HF static batching in one
run and times batch-1 decode in both, reporting each figure (its speed is measured in
docs/benchmarks.md, never asserted here)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_offline_reports_throughput_and_batch1_decode_for_the_engine_and_hf(tiny_checkpoint):
    ran = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "offline", "--model-path", str(tiny_checkpoint("llama")),
         "--num-prompts", "4", "--input-range", "4", "12", "--output-range", "2", "5", "--batch1-tokens", "6",
         "--log-durability", "none"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    figures = json.loads(ran.stdout.strip().splitlines()[-1])
    assert set(figures["output_tok_s"]) == {"tokenledger", "hf_static"}
    assert all(rate > 0 for rate in figures["output_tok_s"].values())
    assert set(figures["batch1_ms_per_token"]) == {"tokenledger", "hf_static"}
    assert "batch-1 decode" in ran.stdout
