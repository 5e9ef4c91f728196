"""Paged attention for CPUs in a small C kernel (`csrc/paged_attention.c`): reads each request's
K/V straight from the pool by slot, with no padded per-layer copy. fp32 only; the registry falls
back to the torch backend for other dtypes or where no compiler is found."""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from kernels.backend import BatchLayout, KVBuffer
from kernels.native import load

_P = ctypes.c_void_p
_I32 = ctypes.c_int32


SOURCE = "paged_attention.c"


@functools.cache
def _library(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    return load(SOURCE, openmp=True, extra_flags=extra_flags)


@functools.cache
def build_kernel(extra_flags: tuple[str, ...] = ()) -> Callable[..., int]:
    """The kernel's entry point, built for this CPU (`extra_flags`: see `kernels.native.load`)."""
    fn = _library(extra_flags).tl_paged_attention_f32
    fn.argtypes = [_P, _P, _P, _P, _P, _P, _I32, _I32, _I32, _I32, ctypes.c_float, _P, _I32]
    fn.restype = ctypes.c_int
    return fn


def _kernel() -> Callable[..., int]:
    return build_kernel()


def kernel_build() -> str | None:
    """The build the backend runs (`kernels.native.build_id`); None where it cannot be built here."""
    from kernels.native import NativeBuildError, build_id

    try:
        return build_id(_library())
    except (NativeBuildError, OSError):
        return None


def kernel_available() -> bool:
    """Builds (or loads the cached) kernel; False where that cannot be done here."""
    from kernels.native import NativeBuildError

    try:
        _kernel()
    except (NativeBuildError, OSError):
        return False
    return True


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, layout: BatchLayout,
                    scale: float, num_threads: int, kernel: Callable[..., int] | None = None) -> torch.Tensor:
    """q [T, Hq, D] → [T, Hq, D] over the pools [S, Hkv, D] (all fp32); `kernel`: another build of it."""
    q = q.contiguous()
    out = torch.empty_like(q)
    tokens, hq, d = q.shape
    if tokens == 0:
        return out
    failed = (kernel or _kernel())(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), layout.qo_indptr.data_ptr(),
                       layout.kv_indptr.data_ptr(), layout.kv_indices.data_ptr(), layout.num_requests, hq,
                       k_pool.shape[1], d, scale, out.data_ptr(), num_threads)
    if failed:
        raise MemoryError("paged attention kernel: out of memory for its scratch buffers")
    return out


class CpuAttentionBackend:
    name = "cpu"

    def __init__(self, kv: KVBuffer, scale: float) -> None:
        self.kv = kv
        self.scale = scale

    def plan(self, layout: BatchLayout) -> CpuAttentionContext:
        return CpuAttentionContext(self.kv, _contiguous(layout), self.scale, torch.get_num_threads())


def _contiguous(layout: BatchLayout) -> BatchLayout:
    """The kernel reads raw int64 pointers: every index tensor must be contiguous int64."""
    fix = [t.to(torch.int64).contiguous() for t in (layout.qo_indptr, layout.kv_indptr, layout.kv_indices)]
    return BatchLayout(layout.out_cache_loc, fix[0], fix[1], fix[2], layout.is_decode, layout.max_kv_len)


class CpuAttentionContext:
    def __init__(self, kv: KVBuffer, layout: BatchLayout, scale: float, num_threads: int) -> None:
        self.kv = kv
        self.layout = layout
        self.scale = scale
        self.num_threads = num_threads

    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.kv.store(layer_id, self.layout.out_cache_loc, k, v)
        k_pool, v_pool = self.kv.k_buffers[layer_id], self.kv.v_buffers[layer_id]
        if torch.compiler.is_compiling():  # a compiled trunk calls the kernel as one opaque op
            lay = self.layout
            return torch.ops.tokenledger.cpu_paged_attention(q, k_pool, v_pool, lay.qo_indptr, lay.kv_indptr,
                                                             lay.kv_indices, self.scale, self.num_threads)
        return paged_attention(q, k_pool, v_pool, self.layout, self.scale, self.num_threads)


def _paged_attention_op(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, qo_indptr: torch.Tensor,
                        kv_indptr: torch.Tensor, kv_indices: torch.Tensor, scale: float, num_threads: int) -> torch.Tensor:
    """`paged_attention` for a graph that inductor compiles: it reads the pools (written by the graph's
    own index_put before this op, in graph order) and returns a new tensor."""
    layout = BatchLayout(kv_indices[:0], qo_indptr, kv_indptr, kv_indices, False)
    return paged_attention(q, k_pool, v_pool, layout, scale, num_threads)


# Defined with the plain operator library, not `torch.library.custom_op`: its Python wrapper costs ~20 us
# a call against ~6 here, once per layer per forward.
_LIB = torch.library.Library("tokenledger", "FRAGMENT")
_LIB.define("cpu_paged_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor qo_indptr, Tensor kv_indptr, "
            "Tensor kv_indices, float scale, int num_threads) -> Tensor")
_LIB.impl("cpu_paged_attention", _paged_attention_op, "CPU")


@torch.library.register_fake("tokenledger::cpu_paged_attention")
def _paged_attention_shape(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, qo_indptr: torch.Tensor,
                           kv_indptr: torch.Tensor, kv_indices: torch.Tensor, scale: float,
                           num_threads: int) -> torch.Tensor:
    return torch.empty_like(q)
