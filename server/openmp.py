"""The process's OpenMP runtime (torch's libgomp): how long its idle workers spin, and giving the calling
thread's workers back to the system.

Spinning: after a parallel region a libgomp worker spins GOMP_SPINCOUNT times (300,000 by default) before
it sleeps. A forward's regions come microseconds apart, so a short spin already keeps the workers warm
inside it; but the default spin outlasts the forward by milliseconds, and on a machine with no core to
spare the spinning worker holds one for the whole of the step's host work (batch building, the commit,
the log). The log writer thread then has no idle core, and the kernel runs it on the scheduler thread's,
preempting it (here: ~9 involuntary switches per step; a 3 µs slice of the KV free list took 30-240 µs).
`default_spin_count` sets a spin that covers the gaps inside a forward and ends soon after it; libgomp reads
it once, when torch loads it, so it is set at `import server`, before torch.

Releasing:

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
import os

from kernels.native import process_libgomp

SPIN_COUNT_VAR = "GOMP_SPINCOUNT"
# Spins before an idle worker sleeps. Measured offline (docs/benchmarks.md, eighth session), tok/s in two
# passes: 300,000 (the default) 4,968 / 6,057; 100,000 5,505 / 6,204; 30,000 5,695 / 6,218; 10,000 6,271 /
# 6,496. 3,000 was slower than 10,000 (4,862 against 5,684): its workers sleep between a forward's regions.
DEFAULT_SPIN_COUNT = "10000"
# Set by the user: they chose how their runtime waits, and it is theirs to keep.
_USER_WAIT_VARS = (SPIN_COUNT_VAR, "OMP_WAIT_POLICY")

_OMP_PAUSE_SOFT = 1  # OpenMP 5.0 omp_pause_resource_t: free the threads, keep nothing else


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process already runs (torch's), never a second copy; None where there is none or
    it predates OpenMP 5.0. Asked at each call: before torch is imported there is none yet."""
    lib = process_libgomp()
    if lib is None or not hasattr(lib, "omp_pause_resource_all"):
        return None
    lib.omp_pause_resource_all.argtypes, lib.omp_pause_resource_all.restype = [ctypes.c_int], ctypes.c_int
    return lib


def default_spin_count() -> bool:
    """Sets GOMP_SPINCOUNT to DEFAULT_SPIN_COUNT for the libgomp torch will load; True if it did. Not where
    the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY, nor once a libgomp is loaded (it read its environment
    then, and a later change would only mislead whoever reads ours)."""
    if spin_count_chosen() or process_libgomp() is not None:
        return False
    os.environ[SPIN_COUNT_VAR] = DEFAULT_SPIN_COUNT
    return True


def spin_count_chosen() -> bool:
    """Whether this process's libgomp waits as chosen (by the user, or by `default_spin_count`), rather than
    with its default spin: False where torch was imported before `server`."""
    return any(name in os.environ for name in _USER_WAIT_VARS)


def without_spin_default(env: dict[str, str], set_here: bool) -> dict[str, str]:
    """`env` less the spin count this process set itself (`set_here`): what a peer server under comparison
    is given, so that it runs as its users run it."""
    return {k: v for k, v in env.items() if not (set_here and k == SPIN_COUNT_VAR)}


def release_thread_pool() -> bool:
    """Ends the calling thread's OpenMP workers (a later parallel region on this thread starts new ones).
    False where the process runs no libgomp or the call refused (inside a parallel region)."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0
