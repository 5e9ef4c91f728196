"""Builds `ForwardBatch`es: allocates KV slots, writes the request-to-token rows, and
marks each sampled token's future-map slot."""
from __future__ import annotations

import torch

from kernels.backend import BatchLayout
from server.forward_batch import ForwardBatch, ForwardMode
from server.memory import ReqToTokenPool, TokenToKVPool
from server.request import Req


class BatchBuilder:
    def __init__(self, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool, future_slots: int) -> None:
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.num_future_slots = future_slots
        self._next_future = 0
        # Every index tensor is made where the pools live (on the CPU that is what it always was).
        self.device = kv_pool.device

    def extend(self, chosen: list[tuple[Req, int]]) -> ForwardBatch:
        ids: list[int] = []
        positions, slots, targets, samples, prefixes = [], [], [], [], []
        for req, n in chosen:
            start = req.scheduled_prefill_len
            ids.extend(req.prompt_ids[start : start + n])
            positions.append(torch.arange(start, start + n, device=self.device))
            slots.append(self._alloc(req, n))
            targets.append(_input_logprob_targets(req, start, n))
            samples.append(start + n == req.prompt_len)
            prefixes.append(start)
        reqs = [r for r, _ in chosen]
        extend_lens = [n for _, n in chosen]
        new = torch.tensor(extend_lens, dtype=torch.int64, device=self.device)
        layout = BatchLayout.of_table(torch.cat(slots), self.req_pool.table, self._rows(reqs),
                                      torch.tensor(prefixes, dtype=torch.int64, device=self.device) + new, new,
                                      widest=max((p + n for p, n in zip(prefixes, extend_lens)), default=0),
                                      is_decode=all(n == 1 for n in extend_lens))
        if self.device.type != "cpu":
            layout = layout.with_host_indptrs(extend_lens, [p + n for p, n in zip(prefixes, extend_lens)])
        return ForwardBatch(
            mode=ForwardMode.EXTEND, reqs=reqs, extend_lens=extend_lens, prefix_lens=prefixes,
            input_ids=torch.tensor(ids, device=self.device), positions=torch.cat(positions), layout=layout,
            samples=samples, input_logprob_targets=targets,
            future_slots=[self._publish(r) for r, s in zip(reqs, samples) if s],
        )

    def decode(self, reqs: list[Req]) -> ForwardBatch:
        # One pass over the requests (this runs every step, for every running request).
        inputs: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        num_placeholders = 0
        for r in reqs:
            committed = r.state.output_ids
            if r.inflight_tokens:  # its previous token is still in flight: read from the future map
                inputs.append(-(r.future_slot + 1))
                num_placeholders += 1
            else:
                inputs.append(committed[-1])
            position = len(r.prompt_ids) + len(committed) + r.inflight_tokens - 1  # prompt_len + scheduled_tokens - 1
            assert r.kv_allocated_len == position, "KV length out of step with position"
            assert r.pool_row is not None, "a decoding request without a table row"
            positions.append(position)
            rows.append(r.pool_row)
        # One slot per request, written into every row of the table at once (the token at
        # position p takes entry p: a decoding request's allocation is its KV length).
        slots = self.kv_pool.alloc(len(reqs))
        assert slots is not None, "KV reservation broken in decode"  # admission reserved max_new_tokens
        layout, pos = BatchLayout.of_decode(slots, self.req_pool.table, rows, positions)
        for r in reqs:
            r.kv_allocated_len += 1
        if self.device.type != "cpu":
            layout = layout.with_host_indptrs([1] * len(reqs), [p + 1 for p in positions])
        return ForwardBatch(
            mode=ForwardMode.DECODE, reqs=list(reqs), extend_lens=[1] * len(reqs), prefix_lens=positions,
            input_ids=torch.tensor(inputs, device=self.device), positions=pos, layout=layout,
            samples=[True] * len(reqs), input_logprob_targets=[[] for _ in reqs],
            future_slots=[self._publish(r) for r in reqs], num_placeholders=num_placeholders,
        )

    def mixed(self, chosen: list[tuple[Req, int]], decoding: list[Req]) -> ForwardBatch:
        """A prefill chunk's extend segments, then one decode segment per running request: one
        forward, packed in that order (each segment's cursors are claimed in the same order)."""
        ext, dec = self.extend(chosen), self.decode(decoding)
        return ForwardBatch(
            mode=ForwardMode.MIXED, reqs=ext.reqs + dec.reqs, extend_lens=ext.extend_lens + dec.extend_lens,
            prefix_lens=ext.prefix_lens + dec.prefix_lens, input_ids=torch.cat((ext.input_ids, dec.input_ids)),
            positions=torch.cat((ext.positions, dec.positions)), layout=ext.layout.then(dec.layout),
            samples=ext.samples + dec.samples, input_logprob_targets=ext.input_logprob_targets + dec.input_logprob_targets,
            future_slots=ext.future_slots + dec.future_slots, num_placeholders=dec.num_placeholders,
        )

    def _rows(self, reqs: list[Req]) -> torch.Tensor:
        return torch.tensor([r.pool_row for r in reqs], dtype=torch.int64, device=self.device)

    def _alloc(self, req: Req, n: int) -> torch.Tensor:
        slots = self.kv_pool.alloc(n)
        # Admission reserved prompt + max_new_tokens, so this cannot fail.
        assert slots is not None, f"KV reservation broken for {req.rid}"
        assert req.pool_row is not None
        self.req_pool.table[req.pool_row, req.kv_allocated_len : req.kv_allocated_len + n] = slots
        req.kv_allocated_len += n
        return slots

    def _publish(self, req: Req) -> int:
        slot = self._next_future
        self._next_future = (self._next_future + 1) % self.num_future_slots
        req.future_slot = slot
        return slot


def _input_logprob_targets(req: Req, start: int, n: int) -> list[int]:
    """Prompt positions this chunk [start, start+n) scores: its own and, through its last row, the
    next chunk's first, so positions are scored across chunk borders exactly once. The prefix cache
    never serves the rows these need (`prefix_cache._max_prefix`)."""
    if not req.wants_input_logprobs:
        return []
    first = max(start + 1, req.logprob.logprob_start_len, 1)
    return list(range(first, min(start + n, req.prompt_len - 1) + 1))
