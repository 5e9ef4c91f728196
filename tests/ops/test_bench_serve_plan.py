"""`tokenledger bench serve`'s random prompts: the input length asked for is the length the server sees."""
from __future__ import annotations

import argparse
import statistics

from transformers import AutoTokenizer

from ops.bench_serve import plan_requests


def test_planned_prompts_reencode_to_the_requested_input_length(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_checkpoint("llama")))
    args = argparse.Namespace(num_prompts=24, input_len=128, output_len=8, range_ratio=0.0, seed=1,
                              abort_fraction=0.0)
    plan = plan_requests(args, tokenizer)
    lengths = [len(tokenizer.encode(p.prompt, add_special_tokens=False)) for p in plan]
    assert lengths == [p.prompt_tokens for p in plan]
    # Decoding random ids and re-encoding merges and splits tokens; unadjusted, 128 read back far off.
    assert statistics.mean(lengths) <= 129 and min(lengths) >= 127, lengths
