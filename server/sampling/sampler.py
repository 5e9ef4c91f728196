"""Batched sampling from fp32 logits: greedy, temperature, top-k, top-p, min-p, seeds.

Each request owns a `torch.Generator`, so a seeded request draws the same noise whatever
else is in its batch. Sampling uses the exponential race (argmax of p / E with E ~ Exp(1)),
which is an exact draw from p and needs one noise vector per row.

On CUDA, FlashInfer's sampling kernels draw the random rows where flashinfer is installed
(`server.sampling.device_sampler`: per-request seeds, other draws than the CPU's); without it the
same race runs on the device's logits with the noise drawn on the host from each request's own
generator and copied over, so a seeded request then draws what it draws on the CPU.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from server.sampling.device_sampler import device_sampling_available, draw_rows
from server.sampling.params import SamplingParams


@dataclass(slots=True)
class SampleOutput:
    token_ids: torch.Tensor  # [n] int64
    logprobs: torch.Tensor  # [n] fp32, log_softmax of the raw logits at the chosen token
    top_ids: torch.Tensor  # [n, k_max]
    top_logprobs: torch.Tensor  # [n, k_max]


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator], top_k_max: int,
    adjust: Callable[[torch.Tensor], None] | None = None,
) -> SampleOutput:
    """`adjust`: applies penalties, logit_bias and min-tokens masks to `logits` in place
    (`penalties.adjust_logits`), after the reported logprobs are taken; None when no row asks."""
    # Logprobs are reported from the unmodified distribution, as HF's log_softmax gives them.
    logprobs_all = torch.log_softmax(logits, dim=-1)
    if adjust is not None:
        adjust(logits)  # the caller's own tensor: the token is drawn from the adjusted logits
    choose_from = logits
    token_ids = choose_from.argmax(dim=-1)
    random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
    if random_rows:
        rows = torch.tensor(random_rows, device=logits.device)
        row_params, row_generators = [params[i] for i in random_rows], [generators[i] for i in random_rows]
        if device_sampling_available(logits):  # CUDA with FlashInfer: server.sampling.device_sampler
            token_ids[rows] = draw_rows(choose_from[rows], row_params, row_generators)
        else:
            token_ids[rows] = _race(choose_from[rows], row_params, row_generators)
    chosen = logprobs_all.gather(1, token_ids[:, None])[:, 0]
    top_vals, top_ids = logprobs_all.topk(top_k_max, dim=-1) if top_k_max else (logprobs_all[:, :0], token_ids[:, None][:, :0])
    return SampleOutput(token_ids, chosen, top_ids, top_vals)


def _race(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> torch.Tensor:
    """The exponential race over each row's filtered distribution. Off the CPU (CUDA without FlashInfer)
    the noise is still drawn on the host, from each request's own generator, and copied over."""
    probs = _filtered_probs(logits, params)
    noise = _exponential_noise(logits.shape[1], generators)
    if logits.device.type != "cpu":
        noise = noise.to(logits.device, non_blocking=True)
    return (probs / noise).argmax(dim=-1)


def _exponential_noise(vocab: int, generators: list[torch.Generator]) -> torch.Tensor:
    """One Exp(1) row per generator. Each row's uniforms come from its own generator (in place, so
    a seeded request draws the same whatever its batch), then one batched inversion: `exponential_`
    per row cost ~26 us for a 1,024-token vocabulary, four times `rand` plus a shared log."""
    uniform = torch.empty(len(generators), vocab)
    for row, generator in enumerate(generators):
        torch.rand(vocab, generator=generator, out=uniform[row])
    # 1 - U lies in (0, 1]; the floor keeps E > 0, so a filtered-out token's 0 / E stays 0 (never NaN).
    return (-torch.log1p(-uniform)).clamp_min_(torch.finfo(uniform.dtype).tiny)


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Each row's distribution after temperature and its own filters. Rows without top-k, top-p or
    min-p skip the sort (the common case, and the costly part with a large vocabulary); whether a
    row is sorted depends on its own parameters only, so a seeded request draws the same token
    whatever it is batched with."""
    temps = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=logits.device)[:, None]
    logits = logits / temps
    vocab = logits.shape[1]
    filtered = [i for i, p in enumerate(params) if 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0]
    if len(filtered) < len(params):
        probs = logits.softmax(dim=-1)
        if filtered:
            rows = torch.tensor(filtered, device=logits.device)
            probs[rows] = _sorted_filter(logits[rows], [params[i] for i in filtered], vocab)
        return probs
    return _sorted_filter(logits, params, vocab)


def _sorted_filter(logits: torch.Tensor, params: list[SamplingParams], vocab: int) -> torch.Tensor:
    device = logits.device
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device).clamp(max=vocab)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=device)[None, :]
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]
    # Keep a token while the mass strictly before it is below top_p (the first always stays).
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep = mass_before < top_p
    min_p = torch.tensor([p.min_p for p in params], device=device)[:, None]
    keep &= sorted_probs >= min_p * sorted_probs[:, :1]
    sorted_probs = sorted_probs * keep
    probs = torch.zeros_like(sorted_probs).scatter_(1, order, sorted_probs)
    return probs / probs.sum(dim=-1, keepdim=True)
