"""Where the forward runs: `--device auto|cpu|cuda` resolved once, at start-up, to a torch device.

The model, the KV pools, the request-to-token table and the future-token map all live on this
device; the scheduler's bookkeeping (free lists' lengths, reservations, the log) stays on the host.
"""
from __future__ import annotations

import os

import torch

from server.errors import ConfigError


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA where torch sees a device, else the CPU; `cuda` without one is refused."""
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not cuda_available():
            raise ConfigError("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
                              "run with --device cpu, or install a CUDA build of torch on a machine with a GPU")
        return torch.device("cuda", torch.cuda.current_device())
    assert name == "auto", f"ServerArgs.validate lets through no device {name!r}"
    return resolve_device("cuda") if cuda_available() else torch.device("cpu")


def kv_budget_bytes(device: torch.device, cpu_fraction: float, cuda_fraction: float) -> int:
    """Bytes the KV pool may take when --max-total-tokens is not given: a share of what is free on a
    CUDA device once the weights are loaded, or of physical memory on the CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * cuda_fraction)
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(physical * cpu_fraction)
