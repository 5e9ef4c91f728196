"""The CUDA overlap: every forward is enqueued on one compute stream, in launch order, and its end
is marked by an event that `ForwardHandle.result()` waits on. None of this exists on the CPU.

Why freeing a finished request's KV slots (and its request-to-token row) while a later forward is
still in flight stays safe, under stream order:

1. Only the compute stream reads or writes the KV pools (`store_kv` and attention, inside the
   forward) and the future-token map. It runs forwards strictly in launch order.
2. The scheduler frees a request's slots on the host, after processing the result of step N, while
   step N+1 may still be running and may still touch those slots (an optimistic decode step of a
   request that finished at N). The freed slots can be handed out again only to a batch built
   after that moment, i.e. step N+2 or later, whose forward the compute stream starts only after
   step N+1 has finished. So no kernel ever writes a slot that an earlier, unfinished kernel still
   reads, and no earlier kernel can overwrite what a later owner wrote.
3. A forward never reads the request-to-token table itself: each batch's slot lists
   (`BatchLayout.kv_indices`, `out_cache_loc`) are gathered from the table when the batch is built,
   on the host's current stream, into tensors the batch owns. Rewriting a freed row for a new
   request therefore cannot change what an in-flight forward reads. Before each launch the compute
   stream waits on the current stream, so those gathers (and the table writes before them) are
   complete when the forward reads them.
4. Tensors made on the current stream and read by the compute stream (the batch's inputs and
   layout) stay referenced by the `ForwardHandle` until its event has completed, so the caching
   allocator cannot reuse their memory while the forward still reads them.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class ComputeStream:
    stream: torch.cuda.Stream

    @classmethod
    def for_device(cls, device: torch.device) -> ComputeStream | None:
        """None on the CPU, where the forward runs inside `launch` and there is nothing to wait for."""
        if device.type != "cuda":
            return None
        return cls(torch.cuda.Stream(device=device))

    @contextmanager
    def enqueue(self) -> Iterator[torch.cuda.Event]:
        """Work issued inside runs on the compute stream after everything already issued on the
        current stream (point 3 above); the yielded event is recorded once the block has issued it."""
        done = torch.cuda.Event()
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield done
            done.record(self.stream)
