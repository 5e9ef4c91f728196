"""Gives the calling thread's OpenMP worker threads back to the system.

libgomp keeps a pool of worker threads per thread that ever ran a parallel region, and it counts every
pool's workers together: once they outnumber the CPUs, every worker spins about a hundred times, not
hundreds of thousands, before it sleeps, so each of a forward's parallel regions (each matmul, each fused
loop) then wakes its workers through the kernel. An `Engine` loads and warms its model on the caller's
thread and runs its forwards on its own, which leaves two pools. Measured on the tiny model's batch-8
decode forward, 2 vCPUs, best of 30 blocks of 100: 1.68-1.75 ms with the caller's pool still there
(10,800 context switches a second), 0.95-1.08 ms with it released (21 a second).
"""
from __future__ import annotations

import ctypes

from kernels.native import process_libgomp

_OMP_PAUSE_SOFT = 1  # OpenMP 5.0 omp_pause_resource_t: free the threads, keep nothing else


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process already runs (torch's), never a second copy; None where there is none or
    it predates OpenMP 5.0. Asked at each call: before torch is imported there is none yet."""
    lib = process_libgomp()
    if lib is None or not hasattr(lib, "omp_pause_resource_all"):
        return None
    lib.omp_pause_resource_all.argtypes, lib.omp_pause_resource_all.restype = [ctypes.c_int], ctypes.c_int
    return lib


def release_thread_pool() -> bool:
    """Ends the calling thread's OpenMP workers (a later parallel region on this thread starts new ones).
    False where the process runs no libgomp or the call refused (inside a parallel region)."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
