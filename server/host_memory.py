"""Host memory for the KV pool that a forked child never shares.

Opening the log forks a reader child (`commitlog.isolate`: recovery reads the old log in a child, so that
damaged bytes crash the child rather than the server). A fork marks every page of the parent
copy-on-write, and the mark stays after the child exits. The next write to each page then traps once. The
pool is allocated before that fork, and a request's K/V are written there at each step. So for as long as
a server had not yet written every slot once, its forwards took a fault for each 4 KB of new K/V. With the
default 2^17 slots, that was the first ~5 headline loads after a start: ~11,000 faults a load, 73 % of them
inside the pool (perf, page-faults with data addresses).

A mapping of our own, marked MADV_DONTFORK, is left out of every child, so its pages stay writable in
the parent. A child that reads the log never touches K/V. The pages are written once here, so that
serving does not pay for their first touch either (torch.zeros did the same).
"""
from __future__ import annotations

import math
import mmap

import torch


def unforked_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor in an anonymous mapping that forked children do not get. Its pages are already
    faulted in. The tensor keeps the mapping alive, and the mapping is unmapped when the last view goes."""
    numel = math.prod(shape)
    region = mmap.mmap(-1, max(numel * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_DONTFORK)
    tensor = torch.frombuffer(region, dtype=dtype, count=numel).view(shape)
    tensor.zero_()  # fault every page in now, not in the first forwards
    return tensor
