"""The request-to-slot table's row prefixes, concatenated (a batch's `kv_indices`), in a few lines of C
(`csrc/gather_rows.c`) on the CPU; None where no compiler is found (the caller uses torch's masked select)."""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from kernels.native import NativeBuildError, load

_P = ctypes.c_void_p


@functools.cache
def _gather() -> Callable[..., None] | None:
    try:
        fn = load("gather_rows.c").tl_gather_rows_i64
    except (NativeBuildError, OSError):
        return None
    fn.argtypes = [_P, ctypes.c_int64, _P, _P, ctypes.c_int32, _P]
    fn.restype = None
    return fn


def gather_row_prefixes(table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor) -> torch.Tensor | None:
    """`cat(table[rows[i], :lens[i]] for i)`, or None where the native gather cannot run (not a CPU
    int64 table, or no compiler). Every length must be within the table's width (the caller's invariant)."""
    if table.device.type != "cpu" or table.dtype != torch.int64 or not table.is_contiguous():
        return None  # checked first: a device table never builds or loads the C library
    fn = _gather()
    if fn is None:
        return None
    rows, lens = rows.to(torch.int64).contiguous(), lens.to(torch.int64).contiguous()
    out = torch.empty(int(lens.sum()), dtype=torch.int64)
    fn(table.data_ptr(), table.stride(0), rows.data_ptr(), lens.data_ptr(), int(rows.numel()), out.data_ptr())
    return out
