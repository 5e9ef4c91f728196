"""The request-to-slot table's row prefixes, concatenated (a batch's `kv_indices`), in a few lines of C
(`csrc/gather_rows.c`) on the CPU; None where no compiler is found (the caller uses torch's masked select)."""
from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

from kernels.native import NativeBuildError, build_id, load

_P = ctypes.c_void_p


SOURCE = "gather_rows.c"


@functools.cache
def _library() -> ctypes.CDLL | None:
    try:
        lib = load(SOURCE)
    except (NativeBuildError, OSError):
        return None
    lib.tl_gather_rows_i64.argtypes = [_P, ctypes.c_int64, _P, _P, ctypes.c_int32, _P]
    lib.tl_gather_rows_i64.restype = None
    lib.tl_decode_layout_i64.argtypes = [_P, ctypes.c_int64, _P, _P, _P, ctypes.c_int32, _P, _P, _P]
    lib.tl_decode_layout_i64.restype = None
    return lib


def library_build() -> str | None:
    """The build of the gather a CPU table uses (`kernels.native.build_id`); None where it cannot be built
    (torch's masked select runs instead)."""
    lib = _library()
    return None if lib is None else build_id(lib)


def _native_table(table: torch.Tensor) -> bool:
    return table.device.type == "cpu" and table.dtype == torch.int64 and table.is_contiguous()


def _gather() -> Callable[..., None] | None:
    lib = _library()
    return None if lib is None else lib.tl_gather_rows_i64


def gather_row_prefixes(table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor) -> torch.Tensor | None:
    """`cat(table[rows[i], :lens[i]] for i)`, or None where the native gather cannot run (not a CPU
    int64 table, or no compiler). Every length must be within the table's width (the caller's invariant)."""
    if not _native_table(table):
        return None  # checked first: a device table never builds or loads the C library
    fn = _gather()
    if fn is None:
        return None
    rows, lens = rows.to(torch.int64).contiguous(), lens.to(torch.int64).contiguous()
    out = torch.empty(int(lens.sum()), dtype=torch.int64)
    fn(table.data_ptr(), table.stride(0), rows.data_ptr(), lens.data_ptr(), int(rows.numel()), out.data_ptr())
    return out


def decode_layout(table: torch.Tensor, rows: list[int], positions: list[int],
                  slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """A decode batch's table update and index tensors in one native call: writes `table[rows[i],
    positions[i]] = slots[i]` and returns (positions, qo_indptr, kv_indptr, kv_indices), request i
    attending to its row's first positions[i] + 1 slots. None (nothing written) where the native code
    cannot run; the caller then builds the same with torch ops."""
    lib = _library() if _native_table(table) else None
    if lib is None or slots.dtype != torch.int64 or not slots.is_contiguous():
        return None
    n = len(rows)
    meta = torch.tensor(rows + positions, dtype=torch.int64)  # one tensor for both lists: one call fewer
    out = torch.empty(2 * (n + 1) + sum(positions) + n, dtype=torch.int64)
    lib.tl_decode_layout_i64(table.data_ptr(), table.stride(0), meta.data_ptr(), meta.data_ptr() + 8 * n,
                             slots.data_ptr(), n, out.data_ptr(), out.data_ptr() + 8 * (n + 1),
                             out.data_ptr() + 16 * (n + 1))
    return meta[n:], out[: n + 1], out[n + 1 : 2 * (n + 1)], out[2 * (n + 1) :]
