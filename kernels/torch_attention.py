"""Paged attention in plain torch: the portable backend and the reference every kernel is tested against.

Extend attends causally over prefix + new tokens, one SDPA per request; decode gathers every
request's slots into one padded batch (a copy of each request's K/V per layer: simple and
exact, which is what a reference is for; `kernels.cpu_attention` avoids the copy). On CUDA it runs
as is (planning reads the index pointers back to the host once per forward: a reference, not fast).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.backend import BatchLayout, KVBuffer


class TorchAttentionBackend:
    name = "torch"

    def __init__(self, kv: KVBuffer, scale: float) -> None:
        self.kv = kv
        self.scale = scale

    def plan(self, layout: BatchLayout) -> TorchAttentionContext:
        return TorchAttentionContext(self.kv, layout, self.scale)


class TorchAttentionContext:
    def __init__(self, kv: KVBuffer, layout: BatchLayout, scale: float) -> None:
        self.kv = kv
        self.layout = layout
        self.scale = scale
        kv_ptr, qo_ptr = layout.kv_indptr.tolist(), layout.qo_indptr.tolist()
        self._slots = [layout.kv_indices[a:b] for a, b in zip(kv_ptr, kv_ptr[1:])]
        self._new = [b - a for a, b in zip(qo_ptr, qo_ptr[1:])]
        self._decode_index: torch.Tensor | None = None
        self._decode_mask: torch.Tensor | None = None
        if layout.is_decode and self._slots:
            lens = layout.kv_indptr.diff()
            self._decode_index = torch.nn.utils.rnn.pad_sequence(self._slots, batch_first=True, padding_value=0)
            mask = torch.arange(self._decode_index.shape[1], device=lens.device)[None, :] < lens[:, None]
            self._decode_mask = mask[:, None, None, :]

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.kv.store(layer_id, self.layout.out_cache_loc, k, v)
        k_buf, v_buf = self.kv.k_buffers[layer_id], self.kv.v_buffers[layer_id]
        if self._decode_index is not None:
            return self._decode(q, k_buf, v_buf)
        return self._extend(q, k_buf, v_buf)

    def _extend(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor) -> torch.Tensor:
        outputs, start = [], 0
        for slots, n_new in zip(self._slots, self._new):
            q_i = q[start : start + n_new].transpose(0, 1)  # [Hq, n_new, D]
            k_i, v_i = k_buf[slots].transpose(0, 1), v_buf[slots].transpose(0, 1)  # [Hkv, S, D]
            prefix = slots.numel() - n_new
            # Query j (absolute position prefix+j) sees keys 0..prefix+j.
            mask = torch.ones(n_new, slots.numel(), dtype=torch.bool, device=q.device).tril(diagonal=prefix)
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
