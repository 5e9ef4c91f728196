"""Runs a `bench offline` workload through vLLM's offline `LLM`, in an interpreter that has vLLM.

Standalone on purpose (imports nothing of tokenledger): `tokenledger bench offline --peer-python P`
runs it as `P peer_vllm_offline.py --model DIR --workload FILE --result FILE`.
"""
from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--workload", required=True,
                   help="JSON: {prompts: [[ids]], output_lens: [n], warmup: {prompts, output_lens}}")
    p.add_argument("--result", required=True, help="where to write the JSON result (vLLM logs to stdout)")
    args = p.parse_args()
    with open(args.workload) as f:
        work = json.load(f)

    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="float32", seed=0)
    def requests(w: dict) -> tuple[list[dict], list[SamplingParams]]:
        return ([{"prompt_token_ids": ids} for ids in w["prompts"]],
                [SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, ignore_eos=True) for n in w["output_lens"]])

    llm.generate(*requests(work["warmup"]), use_tqdm=False)  # untimed: the same shape, other prompts
    prompts, params = requests(work)
    started = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    with open(args.result, "w") as f:
        json.dump({"output_tok_s": tokens / elapsed, "output_tokens": tokens, "seconds": elapsed}, f)


if __name__ == "__main__":
    main()
