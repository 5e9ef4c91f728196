"""What one forward runs (`ForwardBatch`) and what it returns (`BatchResult`).

A result is *packed*: the sampled tokens, their logprobs, input logprobs and hidden
states of all requests sit back to back, in the batch's request order. Result
processing walks them with explicit cursors; a request that contributes nothing to a
field simply does not advance that field's cursor.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from kernels.backend import BatchLayout
from server.request import Req


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill, whole prompt or one chunk of it
    DECODE = "decode"
    MIXED = "mixed"  # extend segments (a prefill chunk) first, then decode segments, one forward


@dataclass(slots=True)
class ForwardBatch:
    mode: ForwardMode
    reqs: list[Req]
    extend_lens: list[int]  # new tokens per request (1 in decode)
    prefix_lens: list[int]  # tokens already in the KV cache per request before this forward
    input_ids: torch.Tensor
    positions: torch.Tensor
    layout: BatchLayout  # where new K/V go and every slot each request attends to (prefix + new)
    samples: list[bool]  # per request: does this forward produce its next token?
    # per request: prompt positions whose input logprob this forward scores (targets).
    input_logprob_targets: list[list[int]]
    # one future-map slot per sampling request, in packed order: where its token is published.
    future_slots: list[int]
    # input ids that are future-map placeholders (counted on the host, so the runner need not ask the tensor)
    num_placeholders: int = 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def top_logprobs_max(self) -> int:
        return max((r.logprob.top_logprobs_num for r, s in zip(self.reqs, self.samples) if s), default=0)

    @property
    def input_top_logprobs_max(self) -> int:
        """Top-k width for prompt positions: the widest among requests scoring any in this forward."""
        return max((r.logprob.top_logprobs_num for r, t in zip(self.reqs, self.input_logprob_targets) if t), default=0)


@dataclass(slots=True)
class BatchResult:
    next_token_ids: list[int]  # one per sampling request, packed
    next_token_logprobs: list[float]
    top_ids: list[list[int]]  # width = batch.top_logprobs_max
    top_logprobs: list[list[float]]
    input_logprobs: list[float]  # packed over requests' targets
    input_top_ids: list[list[int]]  # one list per target, width = batch.input_top_logprobs_max
    input_top_logprobs: list[list[float]]
    hidden_states: torch.Tensor  # [n, hidden], one row per sampling request that asked
