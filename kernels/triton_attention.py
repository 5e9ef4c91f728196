"""The `triton` attention backend: the Triton kernels behind the one backend interface. On CUDA it
runs on the device; on CPU only under TRITON_INTERPRET=1 (tests), never as a serving choice."""
from __future__ import annotations

import os

import torch

from kernels.backend import BatchLayout, KVBuffer


def triton_runs_here(pool: torch.Tensor) -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return pool.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, kv: KVBuffer, scale: float) -> None:
        self.kv = kv
        self.scale = scale

    def plan(self, layout: BatchLayout) -> TritonAttentionContext:
        return TritonAttentionContext(self.kv, layout, self.scale)


class TritonAttentionContext:
    def __init__(self, kv: KVBuffer, layout: BatchLayout, scale: float) -> None:
        self.kv = kv
        self.layout = layout
        self.scale = scale

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from kernels.triton_kernels import paged_attention, store_kv

        k_pool, v_pool = self.kv.k_buffers[layer_id], self.kv.v_buffers[layer_id]
        store_kv(k_pool, v_pool, self.layout.out_cache_loc, k, v)
        return paged_attention(q, k_pool, v_pool, self.layout, self.scale)
