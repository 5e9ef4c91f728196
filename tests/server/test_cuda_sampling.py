"""Sampling on a CUDA device: FlashInfer's kernels (where installed) keep the per-request seeded
semantics and the filters; without FlashInfer the inversion by host uniforms draws what the CPU draws. Marked
`gpu`: skipped with the reason without CUDA; ops/gpu_check.sh runs them."""
from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from server.sampling.params import SamplingParams
from server.sampling.sampler import _inverse_cdf

pytestmark = pytest.mark.gpu

PARAMS = {"max_new_tokens": 12, "temperature": 1.0, "seed": 77, "ignore_eos": True}
PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def _flashinfer():
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer is not installed here (the `cuda` extra)")
    from server.sampling import device_sampler

    return device_sampler


def test_seeded_request_on_cuda_draws_the_same_alone_and_in_a_batch(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), device="cuda")
    target = list(range(10, 40))
    alone = engine.generate(input_ids=target, sampling_params=PARAMS)["output_ids"]
    batch = engine.generate(input_ids=[list(range(5, 9)), target, list(range(3, 60))],
                            sampling_params=[{"max_new_tokens": 12, "temperature": 0.7}, PARAMS, {"top_p": 0.5}])
    assert alone == batch[1]["output_ids"] and len(alone) == 12
    assert engine.generate(input_ids=target, sampling_params={**PARAMS, "seed": 78})["output_ids"] != alone


def test_top_k_one_on_cuda_is_greedy(tiny_checkpoint, make_engine):
    engine = make_engine(tiny_checkpoint("llama"), device="cuda")
    prompt = list(range(3, 50))
    greedy = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})
    top1 = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 8, "top_k": 1, "seed": 5, "ignore_eos": True})
    assert greedy["output_ids"] == top1["output_ids"]


def _draws(draw, params: SamplingParams, n: int = 3000) -> torch.Tensor:
    logits = torch.log(PROBS).repeat(n, 1).cuda()
    return draw(logits, [params] * n, [random.Random(i) for i in range(n)]).cpu()


def test_flashinfer_draws_follow_the_distribution_and_the_filters():
    sampler = _flashinfer()
    freq = torch.bincount(_draws(sampler.draw_rows, SamplingParams()), minlength=4).float() / 3000
    assert torch.allclose(freq, PROBS, atol=0.03)
    assert set(_draws(sampler.draw_rows, SamplingParams(top_k=2), 400).tolist()) <= {0, 1}
    assert set(_draws(sampler.draw_rows, SamplingParams(top_p=0.79), 400).tolist()) <= {0, 1}
    assert 3 not in set(_draws(sampler.draw_rows, SamplingParams(min_p=0.25), 400).tolist())


def test_host_uniforms_on_cuda_draw_what_the_cpu_draws():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(4))
    params = [SamplingParams(temperature=0.8), SamplingParams(top_k=7), SamplingParams(top_p=0.9)] * 2
    cpu = _inverse_cdf(logits, params, [random.Random(i) for i in range(6)])
    cuda = _inverse_cdf(logits.cuda(), params, [random.Random(i) for i in range(6)]).cpu()
    assert torch.equal(cpu, cuda)
