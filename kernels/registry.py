"""Attention backends by name, and `auto`'s choice.

`torch` runs anywhere (and is every kernel's reference); `cpu` is the C kernel for fp32 on CPU;
`triton` runs the Triton kernels (on CUDA, or on CPU under TRITON_INTERPRET=1 for tests);
`flashinfer` runs FlashInfer's paged-KV kernels (CUDA, fp16/bf16; imported only when chosen).
`auto` takes the fastest one that can serve this dtype and device here: on CUDA FlashInfer where it
is importable and serves the dtype, else Triton, else torch; on CPU the C kernel, else torch.
"""
from __future__ import annotations

import torch

from kernels.backend import AttentionBackend, KVBuffer

BACKEND_NAMES = ("auto", "torch", "cpu", "triton", "flashinfer")


class BackendUnavailableError(RuntimeError):
    """A backend named explicitly cannot run here; the message says why."""


def create_backend(name: str, kv: KVBuffer, scale: float) -> AttentionBackend:
    if name not in BACKEND_NAMES:
        raise BackendUnavailableError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    pool = kv.k_buffers[0]
    if name == "flashinfer" or (name == "auto" and pool.device.type == "cuda"):
        from kernels.flashinfer_attention import FlashInferAttentionBackend, unavailable_reason

        reason = unavailable_reason(pool)
        if reason is None:
            return FlashInferAttentionBackend(kv, scale)
        if name == "flashinfer":
            raise BackendUnavailableError(reason)
    if name == "triton" or (name == "auto" and pool.device.type == "cuda"):
        from kernels.triton_attention import TritonAttentionBackend, triton_runs_here

        if triton_runs_here(pool):
            return TritonAttentionBackend(kv, scale)
        if name == "triton":
            raise BackendUnavailableError("the triton attention backend needs triton and a CUDA device "
                                          "(or TRITON_INTERPRET=1 on CPU, for tests)")
    return _cpu_or_torch(name, kv, scale, pool)


def _cpu_or_torch(name: str, kv: KVBuffer, scale: float, pool: torch.Tensor) -> AttentionBackend:
    from kernels.cpu_attention import CpuAttentionBackend, kernel_available
    from kernels.torch_attention import TorchAttentionBackend

    cpu_fits = pool.device.type == "cpu" and pool.dtype == torch.float32
    if name == "torch" or (name == "auto" and not cpu_fits):
        return TorchAttentionBackend(kv, scale)
    if not cpu_fits:
        raise BackendUnavailableError(f"the cpu attention backend serves float32 on CPU, not {pool.dtype} on "
                                      f"{pool.device.type}; use --attention-backend torch")
    if not kernel_available():
        if name == "cpu":
            raise BackendUnavailableError("the cpu attention kernel could not be built here (no C compiler?); "
                                          "use --attention-backend torch")
        return TorchAttentionBackend(kv, scale)
    return CpuAttentionBackend(kv, scale)
