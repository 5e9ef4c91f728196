"""Paged attention in plain torch: the CPU backend and the reference for GPU kernels.

K/V live in a slot pool; each request's slots are listed in its row of the
request-to-token table. Extend attends causally over prefix + new tokens per request;
decode gathers every request's slots into one padded batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from server.memory import TokenToKVPool


@dataclass(slots=True)
class PagedAttentionMetadata:
    """Where this forward's tokens go and which cached tokens each request sees."""

    is_decode: bool
    out_cache_loc: torch.Tensor  # [T] slot for each new token
    kv_indices: list[torch.Tensor]  # per request: slots of every token it attends to (prefix + new)
    extend_lens: list[int]  # per request: new tokens in this forward (1 for decode)


class TorchAttentionContext:
    def __init__(self, pool: TokenToKVPool, meta: PagedAttentionMetadata, scale: float) -> None:
        self.pool = pool
        self.meta = meta
        self.scale = scale
        layout = _padded_decode_layout(meta) if meta.is_decode else None
        self._decode_index: torch.Tensor | None = layout[0] if layout else None
        self._decode_mask: torch.Tensor | None = layout[1] if layout else None

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.store(layer_id, self.meta.out_cache_loc, k, v)
        k_buf, v_buf = self.pool.k_buffers[layer_id], self.pool.v_buffers[layer_id]
        if self._decode_index is not None:
            return self._decode(q, k_buf, v_buf)
        return self._extend(q, k_buf, v_buf)

    def _extend(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor) -> torch.Tensor:
        outputs, start = [], 0
        for slots, n_new in zip(self.meta.kv_indices, self.meta.extend_lens):
            q_i = q[start : start + n_new].transpose(0, 1)  # [Hq, n_new, D]
            k_i, v_i = k_buf[slots].transpose(0, 1), v_buf[slots].transpose(0, 1)  # [Hkv, S, D]
            prefix = slots.numel() - n_new
            # Query j (absolute position prefix+j) sees keys 0..prefix+j.
            mask = torch.ones(n_new, slots.numel(), dtype=torch.bool).tril(diagonal=prefix)
            o = F.scaled_dot_product_attention(q_i, k_i, v_i, attn_mask=mask, scale=self.scale, enable_gqa=True)
            outputs.append(o.transpose(0, 1))
            start += n_new
        return torch.cat(outputs, dim=0)

    def _decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor) -> torch.Tensor:
        assert self._decode_index is not None and self._decode_mask is not None
        k = k_buf[self._decode_index].transpose(1, 2)  # [B, Hkv, S, D]
        v = v_buf[self._decode_index].transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q[:, :, None, :], k, v, attn_mask=self._decode_mask, scale=self.scale, enable_gqa=True
        )
        return o[:, :, 0, :]


def _padded_decode_layout(meta: PagedAttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    lens = torch.tensor([s.numel() for s in meta.kv_indices])
    index = torch.nn.utils.rnn.pad_sequence(meta.kv_indices, batch_first=True, padding_value=0)
    mask = torch.arange(index.shape[1])[None, :] < lens[:, None]
    return index, mask[:, None, None, :]
