"""Logit adjustments a request asks for: repetition/frequency/presence penalties, logit_bias and
min_new_tokens, applied in one batched pass to the rows that ask for any of them.

Definitions follow HF transformers and vLLM (and OpenAI for frequency/presence):
- repetition_penalty r, over every token of the prompt and the output so far: a positive logit
  is divided by r, a negative one multiplied by r;
- frequency_penalty f and presence_penalty p, over output tokens only:
  logit -= f * count(token) + p * (count(token) > 0);
- logit_bias adds its value to its token's logit;
- while fewer than min_new_tokens tokens are out, EOS (unless ignore_eos) and stop_token_ids are -inf.
Applied in HF's order: penalties on the model's logits, then the bias, then the min-tokens mask
(last, so nothing can lift a masked stop back up).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from server.sampling.params import SamplingParams


class TokenCounts:
    """A request's committed token history, as the penalties read it.

    Only a committed transaction adds to it (`commitlog.txn.RequestTxn` stages the tokens and
    calls `add` from `commit`), so a discarded result leaves the counts exactly as they were.
    """

    __slots__ = ("output_counts", "prompt_mask", "num_tokens")

    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], vocab_size: int,
                 device: torch.device | None = None) -> None:
        # Made inside the forward's inference mode, but added to at commit time, outside it:
        # ordinary tensors, or the in-place add would be refused. On the logits' device.
        with torch.inference_mode(False):
            self.output_counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
            self.prompt_mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.prompt_mask[torch.tensor(list(prompt_ids), dtype=torch.int64, device=device)] = True
        self.num_tokens = 0
        self.add(output_ids)

    def add(self, token_ids: Sequence[int]) -> None:
        if token_ids:
            ids = torch.tensor(list(token_ids), dtype=torch.int64, device=self.output_counts.device)
            self.output_counts.index_add_(0, ids, torch.ones(len(ids), device=ids.device))
            self.num_tokens += len(ids)


@dataclass(frozen=True, slots=True)
class AdjustRow:
    """One sampling row's inputs to the adjustments."""

    params: SamplingParams
    counts: TokenCounts | None  # set when the row's params have penalties
    num_outputs: int  # output tokens committed before the one this row samples


def adjust_logits(logits: torch.Tensor, rows: list[AdjustRow], eos_ids: frozenset[int]) -> torch.Tensor:
    """The logits after each row's adjustments; rows that ask for none are returned unchanged.
    Callers skip this entirely when no row adjusts (the zero-cost path)."""
    picked = [i for i, r in enumerate(rows) if r.params.adjusts_logits]
    if not picked:
        return logits
    index = torch.tensor(picked, dtype=torch.int64, device=logits.device)
    sub = logits[index]  # a copy: the raw logits stay for the reported logprobs
    chosen = [rows[i] for i in picked]
    penalized = [j for j, r in enumerate(chosen) if r.params.has_penalties]
    if penalized:
        at = torch.tensor(penalized, dtype=torch.int64, device=logits.device)
        sub[at] = _penalize(sub[at], [chosen[j] for j in penalized])
    _add_bias(sub, chosen)
    _mask_early_stops(sub, chosen, eos_ids)
    out = logits.clone()
    out[index] = sub
    return out


def _penalize(logits: torch.Tensor, rows: list[AdjustRow]) -> torch.Tensor:
    counts_of = [r.counts for r in rows]
    assert all(c is not None for c in counts_of), "a penalized row needs its token counts"
    counts = torch.stack([c.output_counts for c in counts_of if c is not None])
    seen = torch.stack([c.prompt_mask for c in counts_of if c is not None]) | (counts > 0)
    rep = torch.tensor([r.params.repetition_penalty for r in rows], dtype=logits.dtype, device=logits.device)[:, None]
    repeated = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, repeated, logits)
    freq = torch.tensor([r.params.frequency_penalty for r in rows], dtype=logits.dtype, device=logits.device)[:, None]
    pres = torch.tensor([r.params.presence_penalty for r in rows], dtype=logits.dtype, device=logits.device)[:, None]
    return logits - freq * counts - pres * (counts > 0).to(logits.dtype)


def _add_bias(logits: torch.Tensor, rows: list[AdjustRow]) -> None:
    vocab = logits.shape[1]
    # Token ids are checked against the vocabulary at the boundary; the filter keeps a stray one harmless.
    triples = [(j, t, b) for j, r in enumerate(rows) for t, b in r.params.logit_bias if t < vocab]
    if triples:
        at, tokens, bias = zip(*triples)
        device = logits.device
        logits.index_put_((torch.tensor(at, device=device), torch.tensor(tokens, device=device)),
                          torch.tensor(bias, dtype=logits.dtype, device=device), accumulate=True)


def _mask_early_stops(logits: torch.Tensor, rows: list[AdjustRow], eos_ids: frozenset[int]) -> None:
    vocab = logits.shape[1]
    pairs = [(j, t) for j, r in enumerate(rows) if r.num_outputs < r.params.min_new_tokens
             for t in _stop_ids(r.params, eos_ids) if t < vocab]
    if pairs:
        at, tokens = zip(*pairs)
        logits[torch.tensor(at, device=logits.device), torch.tensor(tokens, device=logits.device)] = float("-inf")


def _stop_ids(params: SamplingParams, eos_ids: frozenset[int]) -> set[int]:
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= eos_ids
    return ids
