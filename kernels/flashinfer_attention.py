"""The `flashinfer` attention backend (CUDA only; the `cuda` extra): FlashInfer's paged-KV wrappers
over our pool, read as pages of one slot.

Our pool is [slots, Hkv, D] per layer; viewed as [slots, 1, Hkv, D] it is FlashInfer's "NHD" paged
layout with page size 1, so a request's page list is exactly its slot list from the
request-to-token table (`BatchLayout.kv_indices`) and every last page holds one token. A decode
batch uses the decode wrapper; extend and mixed batches the prefill wrapper, causal, whose mask
puts each request's new tokens last (what `BatchLayout` says). K/V are written by slot with the
pool's own `store` before attending. `flashinfer` is imported only when this backend is created.

FlashInfer's kernels serve float16 and bfloat16; the registry refuses other dtypes.
"""
from __future__ import annotations

import importlib.util
from typing import Any

import torch

from kernels.backend import BatchLayout, KVBuffer

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's scratch for split-KV partial results (its documented size)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def flashinfer_importable() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def unavailable_reason(pool: torch.Tensor) -> str | None:
    """Why the backend cannot serve this pool here (None: it can)."""
    if pool.device.type != "cuda":
        return f"the flashinfer attention backend runs on CUDA only (the KV pool is on {pool.device.type})"
    if not flashinfer_importable():
        return "the flashinfer attention backend needs the flashinfer package (pip install 'tokenledger[cuda]')"
    if pool.dtype not in SUPPORTED_DTYPES:
        return f"flashinfer serves float16/bfloat16 KV, not {pool.dtype}; use --dtype bfloat16 or another backend"
    return None


class FlashInferAttentionBackend:
    name = "flashinfer"

    def __init__(self, kv: KVBuffer, scale: float) -> None:
        import flashinfer

        self.kv = kv
        self.scale = scale
        pool = kv.k_buffers[0]
        self.num_kv_heads, self.head_dim, self.dtype = pool.shape[1], pool.shape[2], pool.dtype
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.device)
        # One workspace for both: a forward is either a decode or a prefill, never both at once.
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._planned: torch.cuda.Event | None = None

    def plan(self, layout: BatchLayout) -> FlashInferAttentionContext:
        return FlashInferAttentionContext(self, layout)

    def wait_for_last_plan(self) -> None:
        """A plan stages its work lists in a page-locked host buffer and copies them to the device
        asynchronously, on the stream. Under overlap the next forward is planned while the previous
        one may still be queued, so the buffer is rewritten only once the last plan's copy has run
        (it has, in practice: that copy sits behind a forward whose result was already processed)."""
        if self._planned is not None:
            self._planned.synchronize()

    def mark_planned(self) -> None:
        self._planned = torch.cuda.Event()
        self._planned.record()


class FlashInferAttentionContext:
    """Plans lazily at the first layer, where the number of query heads is first seen."""

    def __init__(self, backend: FlashInferAttentionBackend, layout: BatchLayout) -> None:
        self.backend = backend
        self.layout = layout
        self._wrapper: Any = None

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kv = self.backend.kv
        kv.store(layer_id, self.layout.out_cache_loc, k, v)
        if self._wrapper is None:
            self._wrapper = self._plan(q.shape[1])
        pages = (kv.k_buffers[layer_id].unsqueeze(1), kv.v_buffers[layer_id].unsqueeze(1))
        return self._wrapper.run(q.contiguous(), pages)

    def _plan(self, num_qo_heads: int) -> Any:
        b, layout = self.backend, self.layout
        b.wait_for_last_plan()
        # Index pointers and last-page lengths go in as host tensors: plan reads them on the host and
        # copies them over itself. Page indices stay on the device.
        qo_host, kv_host = layout.host_indptrs or (layout.qo_indptr.to("cpu", torch.int32),
                                                   layout.kv_indptr.to("cpu", torch.int32))
        indices = layout.kv_indices.to(torch.int32)
        last_page_len = torch.ones(layout.num_requests, dtype=torch.int32)  # page size 1: every page is full
        common: dict[str, Any] = dict(q_data_type=b.dtype, kv_data_type=b.dtype, sm_scale=b.scale)
        if layout.is_decode:
            b.decode_wrapper.plan(kv_host, indices, last_page_len, num_qo_heads, b.num_kv_heads, b.head_dim, 1,
                                  pos_encoding_mode="NONE", **common)
            wrapper = b.decode_wrapper
        else:
            b.prefill_wrapper.plan(qo_host, kv_host, indices, last_page_len, num_qo_heads, b.num_kv_heads,
                                   b.head_dim, 1, causal=True, **common)
            wrapper = b.prefill_wrapper
        b.mark_planned()
        return wrapper
