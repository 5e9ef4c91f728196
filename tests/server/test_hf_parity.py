"""Greedy outputs, logprobs and hidden states equal HF transformers' on the same checkpoint."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from server.forward_batch import ForwardMode

MAX_NEW = 10
PROMPT_LENS = [1, 3, 17, 40, 77, 130, 211, 317]
TIE_TOL = 1e-4


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _hf_greedy(model_dir, prompts):
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=None)
    outs = []
    for p in prompts:
        with torch.no_grad():
            res = hf.generate(torch.tensor([p]), generation_config=cfg, output_scores=True, return_dict_in_generate=True)
        ids = res.sequences[0, len(p):].tolist()
        logprobs = [torch.log_softmax(s[0].float(), dim=-1) for s in res.scores]
        outs.append((ids, logprobs))
    return outs


def _compare(ours: dict, hf_ids: list[int], hf_logprobs: list[torch.Tensor], top_k: int) -> int:
    """Compares token by token; returns how many tokens matched before a tolerated tie."""
    got = ours["output_ids"]
    lps = ours["meta_info"]["output_token_logprobs"]
    tops = ours["meta_info"]["output_top_logprobs"]
    for j, (a, b) in enumerate(zip(got, hf_ids)):
        ref = hf_logprobs[j]
        if a != b:
            # Only a genuine tie may diverge; after it the sequences legitimately differ.
            assert abs(float(ref[a] - ref[b])) < TIE_TOL, f"token {j}: {a} vs HF {b} with no tie"
            return j
        assert abs(lps[j][0] - float(ref[a])) < TIE_TOL
        ref_top = ref.topk(top_k)
        assert [t for _, t, _ in tops[j]] == ref_top.indices.tolist() or _has_tie(ref_top.values)
        assert torch.allclose(torch.tensor([v for v, _, _ in tops[j]]), ref_top.values, atol=TIE_TOL)
    assert len(got) == len(hf_ids) == MAX_NEW
    return len(got)


def _greedy_matched(engine, prompts: list[list[int]], reference) -> int:
    """Runs the prompts greedily with top-5 logprobs and compares each with HF's; the tokens compared."""
    outs = engine.generate(
        input_ids=prompts, sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True},
        return_logprob=True, top_logprobs_num=5,
    )
    return sum(_compare(ours, hf_ids, hf_lps, top_k=5) for ours, (hf_ids, hf_lps) in zip(outs, reference))


def _has_tie(values: torch.Tensor) -> bool:
    return bool((values[:-1] - values[1:]).abs().min() < TIE_TOL)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_i8_greedy_batch_matches_hf_generate_with_any_chunking_overlap_and_linear_backend(arch, tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint(arch)
    prompts = _prompts(500)
    reference = _hf_greedy(model_dir, prompts)
    matched = 0
    # Both linear backends: oneDNN's packed matmuls and nn.Linear (what auto picks for models this small).
    for chunk, no_overlap, linear in ((-1, False, "onednn"), (64, False, "torch"), (29, True, "onednn"), (64, True, "auto")):
        engine = make_engine(model_dir, chunked_prefill_size=chunk, disable_overlap_schedule=no_overlap,
                             linear_backend=linear)
        matched += _greedy_matched(engine, prompts, reference)
    # Ties are rare by construction (peaked random weights): nearly everything must be compared.
    assert matched >= 0.9 * 4 * len(prompts) * MAX_NEW


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_i8_compiled_trunk_greedy_matches_hf_with_chunking_overlap_mixed_and_linear_backend(arch, tiny_checkpoint,
                                                                                             make_engine):
    model_dir = tiny_checkpoint(arch)
    prompts = _prompts(500)
    reference = _hf_greedy(model_dir, prompts)
    matched = 0
    for chunk, no_overlap, mixed, linear in ((-1, False, False, "onednn"), (29, True, False, "torch"),
                                             (64, False, True, "onednn")):
        engine = make_engine(model_dir, chunked_prefill_size=chunk, disable_overlap_schedule=no_overlap,
                             enable_mixed_chunk=mixed, linear_backend=linear, torch_compile="on")
        assert engine.scheduler.runner.model.compiled == "inductor"
        matched += _greedy_matched(engine, prompts, reference)
    assert matched >= 0.9 * 3 * len(prompts) * MAX_NEW


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_input_logprobs_match_hf_log_softmax_across_chunks(arch, tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint(arch)
    prompt = _prompts(500)[6]  # 211 tokens, several chunks
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    expected = [float(ref[p - 1, prompt[p]]) for p in range(1, len(prompt))]
    engine = make_engine(model_dir, chunked_prefill_size=50)
    for start in (0, 5, 120):
        out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0},
                              return_logprob=True, logprob_start_len=start)
        got = out["meta_info"]["input_token_logprobs"]
        assert len(got) == len(prompt) - start
        assert [t for _, t, _ in got] == prompt[start:]
        if start == 0:
            assert got[0][0] is None
            got = got[1:]
        want = expected[max(start, 1) - 1 :]
        assert torch.allclose(torch.tensor([v for v, _, _ in got]), torch.tensor(want), atol=TIE_TOL)


def test_hidden_states_equal_hf_final_normed_states(tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint("qwen2")
    prompt = _prompts(500)[3]
    engine = make_engine(model_dir, chunked_prefill_size=16)
    out = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
                          return_hidden_states=True)
    full = prompt + out["output_ids"]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        states = hf(torch.tensor([full]), output_hidden_states=True).hidden_states[-1][0]
    # The hidden state reported with token j is the one that produced it: position len(prompt)-1+j.
    want = states[len(prompt) - 1 : len(full) - 1]
    got = torch.tensor(out["meta_info"]["hidden_states"])
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-4)


def test_i8_greedy_matches_hf_with_mixed_chunks_and_prefix_cache_hits(tiny_checkpoint, make_engine):
    model_dir = tiny_checkpoint("llama")
    base = _prompts(500)
    shared = base[5]  # 130 tokens every later prompt starts with
    prompts = [shared + tail for tail in base[:5]] + base[6:]
    reference = _hf_greedy(model_dir, [shared, *prompts])
    engine = make_engine(model_dir, chunked_prefill_size=29, enable_mixed_chunk=True)
    params = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
    first = engine.generate(input_ids=shared, sampling_params=params, return_logprob=True, top_logprobs_num=5)
    outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=5)
    assert [o["meta_info"]["cached_tokens"] for o in outs[:5]] == [len(shared)] * 5  # served from the cache
    assert engine.scheduler.stats.steps[ForwardMode.MIXED] > 0  # chunks rode with running decodes
    matched = sum(_compare(ours, ids, lps, top_k=5) for ours, (ids, lps) in zip([first, *outs], reference))
    assert matched >= 0.9 * len(reference) * MAX_NEW
