"""The request-to-slot table's row prefixes (a batch's kv_indices): the C gather equals torch's masked
select, row order and empty rows included, and `BatchLayout.of_table` gives the same layout either way."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels.backend as backend
import kernels.row_gather as row_gather
from kernels.backend import BatchLayout
from kernels.row_gather import gather_row_prefixes

pytestmark = pytest.mark.skipif(row_gather._gather() is None, reason="no C compiler: the native gather is not built here")


def _masked(table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    width = int(lens.max()) if lens.numel() else 0
    return table[rows, :width][torch.arange(width)[None, :] < lens[:, None]]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_native_gather_equals_the_masked_select_for_any_rows_and_lengths(data):
    num_rows, width = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 40))
    table = torch.randint(0, 1 << 40, (num_rows, width), dtype=torch.int64)
    picked = data.draw(st.lists(st.integers(0, num_rows - 1), max_size=12, unique=True))
    lens = [data.draw(st.integers(0, width)) for _ in picked]
    rows_t, lens_t = torch.tensor(picked, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64)
    got = gather_row_prefixes(table, rows_t, lens_t)
    assert got is not None
    assert torch.equal(got, _masked(table, rows_t, lens_t))


def test_a_table_the_gather_cannot_read_gets_none_so_the_caller_falls_back():
    rows, lens = torch.tensor([0]), torch.tensor([2])
    assert gather_row_prefixes(torch.zeros(2, 4, dtype=torch.int32), rows, lens) is None
    assert gather_row_prefixes(torch.zeros(4, 2, dtype=torch.int64).t(), rows, lens) is None  # not contiguous


def test_of_table_builds_the_same_layout_with_and_without_the_native_gather(monkeypatch):
    table = torch.arange(5 * 16, dtype=torch.int64).reshape(5, 16)
    rows, kv_lens, new = torch.tensor([3, 0, 4]), torch.tensor([7, 1, 16]), torch.tensor([1, 1, 2])
    native = BatchLayout.of_table(torch.tensor([9, 8, 7, 6]), table, rows, kv_lens, new)
    monkeypatch.setattr(backend, "gather_row_prefixes", lambda *_: None)
    fallback = BatchLayout.of_table(torch.tensor([9, 8, 7, 6]), table, rows, kv_lens, new)
    assert torch.equal(native.kv_indices, fallback.kv_indices)
    assert torch.equal(native.kv_indices, torch.cat((table[3, :7], table[0, :1], table[4, :16])))
    assert torch.equal(native.kv_indptr, fallback.kv_indptr) and torch.equal(native.qo_indptr, fallback.qo_indptr)
    assert (native.is_decode, native.max_kv_len) == (fallback.is_decode, fallback.max_kv_len) == (False, 16)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_decode_layout_built_natively_equals_the_torch_ops_build_table_writes_included(data):
    num_rows, width = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 40))
    rows = data.draw(st.lists(st.integers(0, num_rows - 1), max_size=12, unique=True))
    positions = [data.draw(st.integers(0, width - 1)) for _ in rows]
    slots = torch.randint(0, 1 << 40, (len(rows),), dtype=torch.int64)
    table = torch.randint(0, 1 << 40, (num_rows, width), dtype=torch.int64)
    native_table, torch_table = table.clone(), table.clone()

    native, native_pos = BatchLayout.of_decode(slots, native_table, rows, positions)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "decode_layout", lambda *_: None)
        fallback, fallback_pos = BatchLayout.of_decode(slots, torch_table, rows, positions)

    assert torch.equal(native_table, torch_table)  # each new slot written at its request's position
    for i, (row, pos) in enumerate(zip(rows, positions)):
        assert int(native_table[row, pos]) == int(slots[i])
    assert native_pos.tolist() == fallback_pos.tolist() == positions
    for name in ("out_cache_loc", "qo_indptr", "kv_indptr", "kv_indices"):
        assert torch.equal(getattr(native, name), getattr(fallback, name)), name
    assert native.kv_indices.tolist() == [s for row, pos in zip(rows, positions) for s in native_table[row, : pos + 1].tolist()]
    assert (native.is_decode, native.max_kv_len) == (fallback.is_decode, fallback.max_kv_len) == (True, max(positions, default=-1) + 1)


def test_a_decode_layout_the_native_code_cannot_write_gets_none_and_leaves_the_table_alone():
    slots = torch.tensor([5])
    int32_table = torch.zeros(2, 4, dtype=torch.int32)
    assert row_gather.decode_layout(int32_table, [0], [1], slots) is None
    assert row_gather.decode_layout(torch.zeros(4, 2, dtype=torch.int64).t(), [0], [1], slots) is None
    table = torch.zeros(2, 4, dtype=torch.int64)
    assert row_gather.decode_layout(table, [0], [1], torch.tensor([5.0])) is None  # slots not int64
    assert not int32_table.any() and not table.any()
