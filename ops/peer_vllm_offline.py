"""Runs `bench offline` workloads through vLLM's offline `LLM`, in an interpreter that has vLLM.

Standalone on purpose (imports nothing of tokenledger): `tokenledger bench offline --peer-python P`
runs it as `P peer_vllm_offline.py --model DIR --warmup FILE --result-fd N`. It loads the model, runs
the warm-up workload untimed, writes `{"ready": true}` to fd N, then times each workload that arrives
as one JSON line on stdin ({prompts: [[ids]], output_lens: [n]}) and writes one JSON result line to
fd N, until stdin ends. vLLM's own logs go to stdout/stderr, so the results have a channel of their own.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--warmup", required=True, help="JSON: {prompts: [[ids]], output_lens: [n]}, run untimed")
    p.add_argument("--result-fd", type=int, required=True, help="where each result line goes")
    args = p.parse_args()
    results = os.fdopen(args.result_fd, "w", buffering=1)
    with open(args.warmup) as f:
        warmup = json.load(f)

    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="float32", seed=0)

    def requests(w: dict) -> tuple[list[dict], list[SamplingParams]]:
        return ([{"prompt_token_ids": ids} for ids in w["prompts"]],
                [SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True) for n in w["output_lens"]])

    llm.generate(*requests(warmup), use_tqdm=False)  # untimed: the same shape, other prompts
    results.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        prompts, params = requests(json.loads(line))
        started = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        results.write(json.dumps({"output_tok_s": tokens / elapsed, "output_tokens": tokens, "seconds": elapsed}) + "\n")


if __name__ == "__main__":
    main()
