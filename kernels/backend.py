"""The attention-backend interface every kernel implements, CPU and GPU alike.

A forward's batch is described once, FlashInfer's ragged way (`BatchLayout`): request r owns
query rows `qo_indptr[r]:qo_indptr[r+1]` and attends to the KV slots
`kv_indices[kv_indptr[r]:kv_indptr[r+1]]`, its new tokens being the last ones (so extend,
decode and a mix of both are one layout). A backend `plan`s a layout once per forward and the
returned context `attend`s once per layer. The KV pool is seen through `KVBuffer`, a protocol
this package owns, so `kernels/` never imports the server.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

from kernels.row_gather import decode_layout, gather_row_prefixes


class KVBuffer(Protocol):
    """Per-layer K and V pools of shape [slots, kv_heads, head_dim], written by slot."""

    k_buffers: list[torch.Tensor]
    v_buffers: list[torch.Tensor]

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None: ...


@dataclass(frozen=True, slots=True)
class BatchLayout:
    out_cache_loc: torch.Tensor  # [T] int64: the slot each new token's K/V is written to
    qo_indptr: torch.Tensor  # [B + 1] int64
    kv_indptr: torch.Tensor  # [B + 1] int64
    kv_indices: torch.Tensor  # [sum of kv lens] int64
    is_decode: bool  # every request has exactly one new token
    # The longest request's KV length, where the builder knows it on the host (None: read it from
    # kv_indptr). Kernels size their grids by it; on a device, reading it back would wait for the stream.
    max_kv_len: int | None = None
    # qo_indptr and kv_indptr as host (CPU, int32) copies, set by a builder whose layout lives on a
    # device: FlashInfer plans its work on the host from them without reading the device back.
    host_indptrs: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def of_requests(cls, out_cache_loc: torch.Tensor, kv_slots: list[torch.Tensor], extend_lens: list[int]) -> BatchLayout:
        """From each request's slots (prefix + new) and its number of new tokens."""
        qo = torch.tensor([0, *extend_lens], dtype=torch.int64).cumsum(0)
        kv = torch.tensor([0, *(s.numel() for s in kv_slots)], dtype=torch.int64).cumsum(0)
        indices = torch.cat(kv_slots) if kv_slots else torch.zeros(0, dtype=torch.int64)
        return cls(out_cache_loc, qo, kv, indices.to(torch.int64), all(n == 1 for n in extend_lens),
                   max((s.numel() for s in kv_slots), default=0))

    @classmethod
    def of_table(cls, out_cache_loc: torch.Tensor, table: torch.Tensor, rows: torch.Tensor, kv_lens: torch.Tensor,
                 extend_lens: torch.Tensor, widest: int | None = None, is_decode: bool | None = None) -> BatchLayout:
        """From a request-to-slot table: request i attends to `table[rows[i], :kv_lens[i]]`. One masked
        gather for the whole batch instead of a slice and a concatenation per request. A caller that
        knows `widest` (max kv_lens) and `is_decode` on the host passes them: on a device, reading
        them back would stall the host until the copy lands."""
        if widest is None:
            widest = int(kv_lens.max()) if kv_lens.numel() else 0
        if is_decode is None:
            is_decode = bool((extend_lens == 1).all())
        indices = gather_row_prefixes(table, rows, kv_lens)
        if indices is None:  # a device table, or no C compiler here
            block = table[rows, :widest]
            indices = block[torch.arange(widest, device=table.device)[None, :] < kv_lens[:, None]]
        zero = torch.zeros(1, dtype=torch.int64, device=table.device)
        return cls(out_cache_loc, torch.cat((zero, extend_lens.cumsum(0))), torch.cat((zero, kv_lens.cumsum(0))),
                   indices, is_decode, widest)

    @classmethod
    def of_decode(cls, slots: torch.Tensor, table: torch.Tensor, rows: list[int],
                  positions: list[int]) -> tuple[BatchLayout, torch.Tensor]:
        """A decode batch: request i's new token, at `positions[i]`, takes `slots[i]` in table row
        `rows[i]` (written here) and attends to that row's first positions[i] + 1 slots. Returns the
        layout and the positions as a tensor."""
        widest = max(positions, default=-1) + 1
        native = decode_layout(table, rows, positions, slots)
        if native is not None:
            pos, qo, kv, indices = native
            return cls(slots, qo, kv, indices, True, widest), pos
        device = table.device
        row_ids = torch.tensor(rows, dtype=torch.int64, device=device)
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        table[row_ids, pos] = slots
        ones = torch.ones(len(rows), dtype=torch.int64, device=device)
        return cls.of_table(slots, table, row_ids, pos + 1, ones, widest=widest, is_decode=True), pos

    def then(self, other: BatchLayout) -> BatchLayout:
        """This batch's requests followed by `other`'s, as one layout (a mixed extend + decode forward)."""
        q_end, kv_end = self.qo_indptr[-1:], self.kv_indptr[-1:]
        return BatchLayout(torch.cat((self.out_cache_loc, other.out_cache_loc)),
                           torch.cat((self.qo_indptr, other.qo_indptr[1:] + q_end)),
                           torch.cat((self.kv_indptr, other.kv_indptr[1:] + kv_end)),
                           torch.cat((self.kv_indices, other.kv_indices)), self.is_decode and other.is_decode,
                           _larger(self.max_kv_len, other.max_kv_len), _joined(self.host_indptrs, other.host_indptrs))

    def with_host_indptrs(self, qo_lens: list[int], kv_lens: list[int]) -> BatchLayout:
        """This layout with host copies of its index pointers, from per-request lengths known on the host."""
        qo = torch.tensor([0, *qo_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        kv = torch.tensor([0, *kv_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return replace(self, host_indptrs=(qo, kv))

    @property
    def num_requests(self) -> int:
        return int(self.qo_indptr.numel()) - 1

    def longest_kv(self) -> int:
        if self.max_kv_len is not None:
            return self.max_kv_len
        return int(self.kv_indptr.diff().max()) if self.num_requests else 0


def _larger(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(a, b)


def _joined(a: tuple[torch.Tensor, torch.Tensor] | None,
            b: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    if a is None or b is None:
        return None
    return torch.cat((a[0], b[0][1:] + a[0][-1])), torch.cat((a[1], b[1][1:] + a[1][-1]))


class AttentionContext(Protocol):
    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this forward's k/v ([T, Hkv, D]) at their slots, then attend q ([T, Hq, D]) → [T, Hq, D]."""
        ...


class AttentionBackend(Protocol):
    name: str

    def plan(self, layout: BatchLayout) -> AttentionContext:
        """Everything per-forward (index tensors, work lists) is prepared here, once for all layers."""
        ...
