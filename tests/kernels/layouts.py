"""Batch layouts for the kernel tests: each request's slots scattered over a pool at random."""
from __future__ import annotations

import torch

from kernels.backend import BatchLayout


def scattered_layout(reqs: list[tuple[int, int]], pool_slots: int, seed: int) -> BatchLayout:
    """`reqs` are (prefix, new) token counts; slot 0 stays unused, as the pool's padding slot."""
    order = torch.randperm(pool_slots - 1, generator=torch.Generator().manual_seed(seed)) + 1
    kv_slots, at = [], 0
    for prefix, new in reqs:
        kv_slots.append(order[at : at + prefix + new])
        at += prefix + new
    out_loc = torch.cat([s[-new:] for s, (_, new) in zip(kv_slots, reqs)])
    return BatchLayout.of_requests(out_loc, kv_slots, [new for _, new in reqs])
