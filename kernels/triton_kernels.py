"""Triton kernels for the GPU path, each with a plain-torch reference in `kernels/reference.py`.

They run on CUDA, and on CPU under `TRITON_INTERPRET=1` (how the normal suite checks them
against their references on small shapes). Every kernel reads the batch FlashInfer's ragged way
(`BatchLayout`), so extend, decode and a mixed batch are one launch.

Attention is split-K with a fixed split size: each (query row, query head, split) program does an
online softmax over at most `SPLIT` visible keys, and a second kernel merges the splits by their
log-sum-exp. Splits past a row's visible keys contribute exactly zero, so a request's result does
not depend on what it is batched with (the bound on splits is the batch's longest request).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import BatchLayout

SPLIT = 64  # keys per split: fixed, never derived from the batch
BLOCK_N = 16  # keys per inner step of a split


@triton.jit
def _store_kv_kernel(k_pool, v_pool, slots, k, v, ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots + t)
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    tl.store(k_pool + slot * ROW + offs, tl.load(k + t * ROW + offs, mask=mask), mask=mask)
    tl.store(v_pool + slot * ROW + offs, tl.load(v + t * ROW + offs, mask=mask), mask=mask)


def store_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k_pool[slots[t]] = k[t] (and v), pools [S, Hkv, D], k/v [T, Hkv, D]."""
    tokens = slots.numel()
    if tokens == 0:
        return
    row = k_pool.shape[1] * k_pool.shape[2]
    _store_kv_kernel[(tokens,)](k_pool, v_pool, slots.contiguous(), k.contiguous(), v.contiguous(), ROW=row,
                                BLOCK=triton.next_power_of_2(row))


@triton.jit
def _attention_split_kernel(q, k_pool, v_pool, row_request, qo_indptr, kv_indptr, kv_indices, mid_out, mid_lse,
                            scale, max_splits, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                            BLOCK_D: tl.constexpr, SPLIT_: tl.constexpr, BLOCK_N_: tl.constexpr):
    row = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    r = tl.load(row_request + row)
    q_start = tl.load(qo_indptr + r)
    n_new = tl.load(qo_indptr + r + 1) - q_start
    kv_start = tl.load(kv_indptr + r)
    kv_len = tl.load(kv_indptr + r + 1) - kv_start
    visible = kv_len - n_new + (row - q_start) + 1  # causal: its own position and everything before
    lo = s * SPLIT_
    hi = tl.minimum(lo + SPLIT_, visible)
    kvh = h // (HQ // HKV)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    qv = tl.load(q + (row * HQ + h) * D + d, mask=dmask, other=0.0)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N_):
        n = start + tl.arange(0, BLOCK_N_)
        nmask = n < hi
        slot = tl.load(kv_indices + kv_start + n, mask=nmask, other=0)
        both = nmask[:, None] & dmask[None, :]
        kt = tl.load(k_pool + (slot[:, None] * HKV + kvh) * D + d[None, :], mask=both, other=0.0)
        scores = tl.where(nmask, tl.sum(kt * qv[None, :], 1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, 0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new)
        vt = tl.load(v_pool + (slot[:, None] * HKV + kvh) * D + d[None, :], mask=both, other=0.0)
        total = total * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * vt, 0)
        m = m_new
    at = (row * HQ + h) * max_splits + s
    has_keys = hi > lo
    tl.store(mid_out + at * D + d, tl.where(has_keys, acc / tl.where(has_keys, total, 1.0), 0.0), mask=dmask)
    tl.store(mid_lse + at, tl.where(has_keys, m + tl.log(tl.where(has_keys, total, 1.0)), float("-inf")))


@triton.jit
def _attention_merge_kernel(mid_out, mid_lse, out, max_splits, HQ: tl.constexpr, D: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    h = tl.program_id(1)
    base = (row * HQ + h) * max_splits
    s = tl.arange(0, BLOCK_S)
    smask = s < max_splits
    lse = tl.load(mid_lse + base + s, mask=smask, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.exp(lse - top)  # a split past the row's keys has lse -inf: weight exactly 0
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    parts = tl.load(mid_out + (base + s[:, None]) * D + d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
    merged = tl.sum(w[:, None] * parts, 0) / tl.sum(w, 0)
    tl.store(out + (row * HQ + h) * D + d, merged, mask=dmask)


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, layout: BatchLayout,
                    scale: float) -> torch.Tensor:
    """q [T, Hq, D] → [T, Hq, D]: each query row attends causally to its request's slots."""
    tokens, hq, d = q.shape
    out = torch.empty_like(q)
    if tokens == 0:
        return out
    qo_lens = layout.qo_indptr.diff()
    # output_size and the host-known longest KV keep this free of device-to-host reads (no stall on CUDA).
    row_request = torch.repeat_interleave(torch.arange(layout.num_requests, device=q.device), qo_lens,
                                          output_size=tokens)
    longest = layout.longest_kv()
    max_splits = triton.cdiv(longest, SPLIT)
    mid_out = torch.empty(tokens, hq, max_splits, d, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(tokens, hq, max_splits, dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(d)
    _attention_split_kernel[(tokens, hq, max_splits)](
        q.contiguous(), k_pool, v_pool, row_request, layout.qo_indptr, layout.kv_indptr, layout.kv_indices, mid_out,
        mid_lse, scale, max_splits, HQ=hq, HKV=k_pool.shape[1], D=d, BLOCK_D=block_d, SPLIT_=SPLIT, BLOCK_N_=BLOCK_N)
    _attention_merge_kernel[(tokens, hq)](mid_out, mid_lse, out, max_splits, HQ=hq, D=d, BLOCK_D=block_d,
                                          BLOCK_S=triton.next_power_of_2(max_splits))
    return out


@triton.jit
def _apply_bitmask_kernel(logits, bitmask, rows, vocab, words, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    row = tl.load(rows + i)
    v = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    vmask = v < vocab
    word = tl.load(bitmask + row * words + v // 32, mask=vmask, other=0)
    allowed = ((word >> (v % 32)) & 1) != 0
    current = tl.load(logits + row * vocab + v, mask=vmask, other=0.0)
    tl.store(logits + row * vocab + v, tl.where(allowed, current, float("-inf")), mask=vmask)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """In place: in each of `rows`, a token whose bit is 0 (xgrammar's packed int32 mask) becomes -inf."""
    if not rows:
        return
    vocab = logits.shape[1]
    block = 256
    index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    _apply_bitmask_kernel[(len(rows), triton.cdiv(vocab, block))](logits, bitmask.contiguous(), index, vocab,
                                                                  bitmask.shape[1], BLOCK=block)


@triton.jit
def _gather_segments_kernel(packed, starts, lengths, out_starts, out, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    start = tl.load(starts + r)
    length = tl.load(lengths + r)
    to = tl.load(out_starts + r)
    for first in range(0, length, BLOCK):
        offs = first + tl.arange(0, BLOCK)
        mask = offs < length
        tl.store(out + to + offs, tl.load(packed + start + offs, mask=mask), mask=mask)


def gather_segments(packed: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The segments `packed[starts[r] : starts[r] + lengths[r]]`, back to back in request order: how
    each request's slice of a packed result (logprobs, input logprobs) is claimed by its cursor."""
    total = int(lengths.sum()) if lengths.numel() else 0
    out = torch.empty(total, dtype=packed.dtype, device=packed.device)
    if total == 0:
        return out
    out_starts = torch.cumsum(lengths, 0) - lengths
    _gather_segments_kernel[(lengths.numel(),)](packed, starts.contiguous(), lengths.contiguous(), out_starts, out,
                                                BLOCK=64)
    return out
