"""Plain-torch references for the Triton kernels (`kernels/triton_kernels.py`): the semantics
each kernel must match, written for clarity, not speed."""
from __future__ import annotations

import torch

from kernels.backend import BatchLayout
from kernels.torch_attention import TorchAttentionContext


def store_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    k_pool[slots] = k
    v_pool[slots] = v


class _Pool:
    """The pools as a `KVBuffer`; the caller has stored this forward's K/V already."""

    def __init__(self, k_pool: torch.Tensor, v_pool: torch.Tensor) -> None:
        self.k_buffers, self.v_buffers = [k_pool], [v_pool]

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        raise AssertionError("the reference never stores")


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, layout: BatchLayout,
                    scale: float) -> torch.Tensor:
    """Per request, causal SDPA over its slots (prefix + new tokens): the torch backend's extend path."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    ragged = BatchLayout(layout.out_cache_loc, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, False)
    return TorchAttentionContext(_Pool(k_pool, v_pool), ragged, scale)._extend(q, k_pool, v_pool)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    vocab = logits.shape[1]
    bits = torch.arange(vocab)
    for row in rows:
        allowed = ((bitmask[row, bits // 32] >> (bits % 32)) & 1) != 0
        logits[row] = torch.where(allowed, logits[row], torch.tensor(float("-inf")))


def gather_segments(packed: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    pieces = [packed[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
    return torch.cat(pieces) if pieces else packed[:0]
