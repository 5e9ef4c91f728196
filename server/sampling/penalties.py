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
    """A request's committed token history, as the penalties read it: sparse, so a step costs
    the tokens a request has seen, not its vocabulary (a dense [rows, vocab] pass took ~0.5 s a
    step for 64 rows of a 152k vocabulary on one core).

    `seen_ids`: the distinct ids of prompt and output (repetition); `output_ids` with
    `output_counts`: the distinct output ids and how often each was output (frequency, presence).
    Only a committed transaction adds to it (`commitlog.txn.RequestTxn` stages the tokens and
    calls `add` from `commit`), so a discarded result leaves the counts exactly as they were.
    """

    __slots__ = ("seen_ids", "output_ids", "output_counts", "num_tokens", "_seen", "_position")

    def __init__(self, prompt_ids: Sequence[int], output_ids: Sequence[int], device: torch.device | None = None) -> None:
        self._seen = set(int(t) for t in prompt_ids)
        self._position: dict[int, int] = {}  # output id -> its index in output_ids
        # Made inside the forward's inference mode, but added to at commit time, outside it:
        # ordinary tensors, or the in-place add would be refused. On the logits' device.
        with torch.inference_mode(False):
            self.seen_ids = torch.tensor(sorted(self._seen), dtype=torch.int64, device=device)
            self.output_ids = torch.zeros(0, dtype=torch.int64, device=device)
            self.output_counts = torch.zeros(0, dtype=torch.float32, device=device)
        self.num_tokens = 0
        self.add(output_ids)

    def add(self, token_ids: Sequence[int]) -> None:
        device = self.output_ids.device
        for token in map(int, token_ids):
            at = self._position.get(token)
            if at is None:
                self._position[token] = len(self._position)
                new = torch.tensor([token], dtype=torch.int64, device=device)
                self.output_ids = torch.cat((self.output_ids, new))
                self.output_counts = torch.cat((self.output_counts, torch.ones(1, device=device)))
            else:
                self.output_counts[at] += 1
            if token not in self._seen:
                self._seen.add(token)
                self.seen_ids = torch.cat((self.seen_ids, torch.tensor([token], dtype=torch.int64, device=device)))
        self.num_tokens += len(token_ids)


@dataclass(frozen=True, slots=True)
class AdjustRow:
    """One sampling row's inputs to the adjustments."""

    params: SamplingParams
    counts: TokenCounts | None  # set when the row's params have penalties
    num_outputs: int  # output tokens committed before the one this row samples


def adjust_logits(logits: torch.Tensor, rows: list[AdjustRow], eos_ids: frozenset[int]) -> None:
    """Applies each row's adjustments in place; a row that asks for none is left as it is. The
    sampler calls this after taking the reported logprobs from the same logits, so no copy of
    a [rows, vocab] tensor is made; callers skip it when no row adjusts (the zero-cost path)."""
    _penalize(logits, rows)
    _add_bias(logits, rows)
    _mask_early_stops(logits, rows, eos_ids)


def _penalize(logits: torch.Tensor, rows: list[AdjustRow]) -> None:
    """Repetition over each row's seen ids, then frequency/presence over its output ids: one
    gather and one scatter each, over the (row, id) pairs the rows have seen (distinct per row)."""
    assert all(r.counts is not None for r in rows if r.params.has_penalties), "a penalized row needs its counts"
    rep = [(j, r.counts.seen_ids, r.params.repetition_penalty) for j, r in enumerate(rows)
           if r.counts is not None and r.params.repetition_penalty != 1.0]
    if rep:
        at, ids, factor = _pairs(logits, [(j, t, torch.full_like(t, f, dtype=logits.dtype)) for j, t, f in rep])
        values = logits[at, ids]
        logits[at, ids] = torch.where(values > 0, values / factor, values * factor)
    fp = [(j, r.counts, r.params) for j, r in enumerate(rows)
          if r.counts is not None and (r.params.frequency_penalty != 0.0 or r.params.presence_penalty != 0.0)]
    if fp:
        at, ids, minus = _pairs(logits, [(j, c.output_ids, p.frequency_penalty * c.output_counts + p.presence_penalty)
                                         for j, c, p in fp])
        logits[at, ids] = logits[at, ids] - minus


def _pairs(logits: torch.Tensor, parts: list[tuple[int, torch.Tensor, torch.Tensor]]
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row indices, token ids and per-pair values, concatenated over rows."""
    device = logits.device
    at = torch.cat([torch.full((t.numel(),), j, dtype=torch.int64, device=device) for j, t, _ in parts])
    ids = torch.cat([t.to(device) for _, t, _ in parts])
    values = torch.cat([v.to(device=device, dtype=logits.dtype) for _, _, v in parts])
    return at, ids, values


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
