"""Random draws on a CUDA device with FlashInfer's sampling kernels (the `cuda` extra), behind
`server.sampling.sampler.sample`. Greedy rows, logprobs and top-logprobs never come here.

Same seeded semantics per request as on the CPU: a request's draw depends on its own stream and
on nothing else in its batch. Each step takes one 62-bit seed from the request's own (host)
`random.Random`, seeds a device generator with it, and draws that row alone, so a seeded request
repeats its tokens whatever it is batched with. The draws are not the CPU path's draws (another
random stream), and one kernel chain per random row is the price of that independence (a per-row
seed tensor for one batched call is a later step, once it has been checked on a device).

Filters, in the CPU path's order: temperature, then top-k (renormalised), then top-p (renormalised),
then min-p relative to the most likely token, which the renormalisations do not change.
"""
from __future__ import annotations

import functools
import importlib.util
import random
from typing import Any

import torch

from server.sampling.params import SamplingParams

_SEED_BITS = 62


def device_sampling_available(device: torch.device) -> bool:
    """Random rows on `device` are drawn here: a CUDA device, with FlashInfer installed."""
    return device.type == "cuda" and _flashinfer_installed()


@functools.cache
def _flashinfer_installed() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def draw_rows(logits: torch.Tensor, params: list[SamplingParams], streams: list[random.Random]) -> torch.Tensor:
    """One token per row of `logits` ([n, vocab] fp32 on CUDA), each from its own request's stream."""
    import flashinfer.sampling as fs

    out = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    for row, (p, stream) in enumerate(zip(params, streams)):
        seed = stream.getrandbits(_SEED_BITS)  # host stream: no device sync
        device_generator = torch.Generator(device=logits.device).manual_seed(seed)
        probs = _filtered(fs, logits[row : row + 1], p)
        out[row] = _draw(fs, probs, p, device_generator)[0]
    return out


def _filtered(fs: Any, logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    probs = torch.softmax(logits / p.temperature, dim=-1)
    vocab = logits.shape[-1]
    if 0 < p.top_k < vocab:
        probs = fs.top_k_renorm_probs(probs, p.top_k)
    if p.top_p < 1.0:
        probs = fs.top_p_renorm_probs(probs, p.top_p)
    return probs


def _draw(fs: Any, probs: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    if p.min_p > 0.0:
        return fs.min_p_sampling_from_probs(probs, p.min_p, generator=generator)
    return fs.sampling_from_probs(probs, generator=generator)
