"""Prompt logprobs (and their top-k) scored in row blocks, across prefill chunks, equal HF's."""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

import server.model_runner as runner_module

TOL = 1e-4


def test_prompt_logprobs_in_small_row_blocks_across_chunks_equal_hf(tiny_checkpoint, make_engine, monkeypatch):
    monkeypatch.setattr(runner_module, "INPUT_LOGPROB_ROWS", 5)  # blocks cut across every 16-token chunk
    model_dir = tiny_checkpoint("qwen3")
    prompt = torch.randint(3, 500, (41,), generator=torch.Generator().manual_seed(8)).tolist()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    engine = make_engine(model_dir, chunked_prefill_size=16)
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                          top_logprobs_num=3, logprob_start_len=2)
    meta = out["meta_info"]
    got = torch.tensor([lp for lp, _, _ in meta["input_token_logprobs"]])
    assert [t for _, t, _ in meta["input_token_logprobs"]] == prompt[2:] and out["output_ids"] == []
    want = ref[1:-1].gather(1, torch.tensor(prompt[2:])[:, None])[:, 0]
    assert torch.allclose(got, want, atol=TOL, rtol=0)
    tops = torch.tensor([[lp for lp, _, _ in top] for top in meta["input_top_logprobs"]])
    assert torch.allclose(tops, ref[1:-1].topk(3).values, atol=TOL, rtol=0)
