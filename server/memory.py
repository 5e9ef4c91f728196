"""KV memory: a request-to-token table and a token-to-KV pool of slots.

`ReqToTokenPool` maps (request row, position) → KV slot; `TokenToKVPool` holds the K/V
tensors per layer and a free list of slots. Slot 0 is never handed out: it is the
padding slot that batched decode gathers for positions past a request's length.

Both live on the forward's device (`--device`): the table and the free list are index tensors
that the batch builder slices and gathers into each batch's layout, so on CUDA no slot crosses
the bus per step. Their sizes (`num_free`) are host-side shape reads, never a device sync.
"""
from __future__ import annotations

import torch

from server.host_memory import unforked_zeros


class ReqToTokenPool:
    def __init__(self, num_rows: int, max_context_len: int, device: torch.device | str = "cpu") -> None:
        self.num_rows = num_rows
        self.max_context_len = max_context_len
        self.table = torch.zeros((num_rows, max_context_len), dtype=torch.int64, device=device)
        self._free_rows = list(range(num_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        return self._free_rows.pop() if self._free_rows else None

    def free(self, row: int) -> None:
        assert 0 <= row < self.num_rows and row not in self._free_rows, f"double free of row {row}"
        self._free_rows.append(row)


class TokenToKVPool:
    def __init__(
        self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.capacity = num_slots
        self.device = torch.device(device)
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k_buffers = [self._zeros(shape, dtype) for _ in range(num_layers)]
        self.v_buffers = [self._zeros(shape, dtype) for _ in range(num_layers)]
        self._free_slots = torch.arange(1, num_slots + 1, dtype=torch.int64, device=device)

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # On the host, out of reach of the log's forked reader (server.host_memory): written every step.
        if self.device.type == "cpu":
            return unforked_zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    @property
    def num_free(self) -> int:
        return int(self._free_slots.numel())

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    def can_alloc(self, n: int) -> bool:
        return n <= self.num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.num_free:
            return None
        slots, self._free_slots = self._free_slots[:n], self._free_slots[n:]
        return slots

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self._free_slots = torch.cat((self._free_slots, slots.to(torch.int64)))
        assert self.num_free <= self.capacity, "KV slots freed twice"

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffers[layer_id][slots] = k
        self.v_buffers[layer_id][slots] = v

    def bytes_per_slot(self) -> int:
        k = self.k_buffers[0]
        return 2 * len(self.k_buffers) * k.shape[1] * k.shape[2] * k.element_size()
