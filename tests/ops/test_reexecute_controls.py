"""Re-execution of requests whose sampling controls (penalties, logit bias, min tokens) are staged in
the transaction: the logged BEGIN carries them, the re-run applies them, every token is proven."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from logcli_helpers import cli


def test_penalties_logit_bias_and_min_tokens_reexecute_bit_for_bit(tiny_checkpoint: Any, tmp_path: Path) -> None:
    from server import Engine

    log = tmp_path / "log"
    engine = Engine(model_path=str(tiny_checkpoint("llama")), log_dir=str(log), max_total_tokens=2048,
                    chunked_prefill_size=8, log_durability="none")
    controls = [
        {"frequency_penalty": 0.7, "presence_penalty": 0.3, "temperature": 0.8, "seed": 5},
        {"repetition_penalty": 1.3, "temperature": 0},
        {"logit_bias": {"7": 5.0, "9": -100.0}, "min_new_tokens": 6, "temperature": 0},
    ]
    try:
        outs = engine.generate(input_ids=[[5, 6, 7, 8, 9, 10, 11, 12, 13] for _ in controls],
                               sampling_params=[{"max_new_tokens": 12, **c} for c in controls], return_logprob=True,
                               rid=["freq", "rep", "bias"])
    finally:
        engine.shutdown()
    assert all(len(o["output_ids"]) >= 6 for o in outs)
    ran = cli("replay", "--log-dir", log, "--reexecute", "--json")
    assert ran.rc == 0, ran.out + ran.err
    found = {r["rid"]: r for r in ran.json()["requests"]}
    assert all(found[r]["status"] == "proven" and found[r]["tokens_checked"] > 0 for r in ("freq", "rep", "bias"))
