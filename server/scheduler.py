"""The scheduler: waiting queue, running batch, prefill-first policy, chunked prefill.

`step()` builds one forward batch, runs it and applies its result. KV for a request is
*reserved* in full (prompt + max_new_tokens) when it is admitted, so decode can never run
out of slots mid-request; a request that does not fit waits at the head of the queue.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from server.finish import Detokenize, check_finish
from server.forward_batch import ForwardBatch, ForwardMode
from server.memory import ReqToTokenPool, TokenToKVPool
from server.model_runner import ModelRunner
from server.outputs import RequestDelta
from server.request import FinishReason, Req
from server.result_processing import process_decode_result, process_extend_result


@dataclass(slots=True)
class StepStats:
    """Cumulative step counts, tokens and seconds per forward mode (benchmarks, metrics)."""

    steps: dict[ForwardMode, int] = field(default_factory=lambda: dict.fromkeys(ForwardMode, 0))
    tokens: dict[ForwardMode, int] = field(default_factory=lambda: dict.fromkeys(ForwardMode, 0))
    seconds: dict[ForwardMode, float] = field(default_factory=lambda: dict.fromkeys(ForwardMode, 0.0))

    def record(self, mode: ForwardMode, tokens: int, seconds: float) -> None:
        self.steps[mode] += 1
        self.tokens[mode] += tokens
        self.seconds[mode] += seconds


@dataclass(frozen=True, slots=True)
class SchedulePolicy:
    max_running_requests: int
    chunked_prefill_size: int  # <= 0: no chunking
    max_prefill_tokens: int
    context_len: int

    @property
    def prefill_budget(self) -> int:
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens


class Scheduler:
    def __init__(
        self, policy: SchedulePolicy, runner: ModelRunner, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool,
        eos_ids: frozenset[int], detokenize: Detokenize,
    ) -> None:
        self.policy = policy
        self.runner = runner
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.eos_ids = eos_ids
        self.detokenize = detokenize
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []  # prefill done, decoding
        self.chunked_req: Req | None = None  # mid-way through a chunked prefill
        self.reserved_tokens = 0
        self.stats = StepStats()

    # -- queue ----------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        self.waiting.append(req)

    @property
    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req)

    @property
    def num_live(self) -> int:
        return len(self.running) + (self.chunked_req is not None)

    # -- one step -------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        batch = self.next_batch()
        if batch is None:
            return []
        started = time.perf_counter()
        result = self.runner.forward(batch)
        deltas: list[RequestDelta] = []
        if batch.mode is ForwardMode.EXTEND:
            self._finish_checks(process_extend_result(batch, result, deltas), deltas, newly_prefilled=True)
        else:
            self._finish_checks(process_decode_result(batch, result, deltas), deltas, newly_prefilled=False)
        self.stats.record(batch.mode, batch.num_tokens, time.perf_counter() - started)
        return deltas

    def next_batch(self) -> ForwardBatch | None:
        extend = self._admit_for_extend()
        if extend:
            return self._build_extend_batch(extend)
        if self.running:
            return self._build_decode_batch(self.running)
        return None

    # -- admission ------------------------------------------------------------------
    def _admit_for_extend(self) -> list[tuple[Req, int]]:
        budget = self.policy.prefill_budget
        chosen: list[tuple[Req, int]] = []
        if self.chunked_req is not None:
            req, self.chunked_req = self.chunked_req, None
            chosen.append((req, min(req.prompt_len - req.prefilled_len, budget)))
            budget -= chosen[-1][1]
        while self.waiting and budget > 0 and self.num_live + len(chosen) < self.policy.max_running_requests:
            req = self.waiting[0]
            if not self._reserve(req):
                break  # head-of-line waits for memory; FIFO keeps admission fair
            self.waiting.popleft()
            chosen.append((req, min(req.prompt_len, budget)))
            budget -= chosen[-1][1]
        for req, n in chosen:
            if req.prefilled_len + n < req.prompt_len:
                self.chunked_req = req  # at most one: the budget is spent once it is chunked
        return chosen

    def _reserve(self, req: Req) -> bool:
        need = req.prompt_len + req.params.max_new_tokens
        if self.reserved_tokens + need > self.kv_pool.capacity or self.req_pool.num_free == 0:
            return False
        req.pool_row = self.req_pool.alloc()
        req.reserved_tokens = need
        self.reserved_tokens += need
        return True

    # -- batch building -------------------------------------------------------------
    def _build_extend_batch(self, chosen: list[tuple[Req, int]]) -> ForwardBatch:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        slots, kv_indices, targets = [], [], []
        for req, n in chosen:
            start = req.prefilled_len
            ids.extend(req.prompt_ids[start : start + n])
            positions.append(torch.arange(start, start + n))
            slots.append(self._alloc_slots(req, n))
            kv_indices.append(self.req_pool.table[req.pool_row, : start + n])
            targets.append(self._input_logprob_targets(req, start, n))
        return ForwardBatch(
            mode=ForwardMode.EXTEND, reqs=[r for r, _ in chosen], extend_lens=[n for _, n in chosen],
            prefix_lens=[r.prefilled_len for r, _ in chosen], input_ids=torch.tensor(ids),
            positions=torch.cat(positions), out_cache_loc=torch.cat(slots), kv_indices=kv_indices,
            samples=[r.prefilled_len + n == r.prompt_len for r, n in chosen], input_logprob_targets=targets,
        )

    def _build_decode_batch(self, reqs: list[Req]) -> ForwardBatch:
        slots = torch.cat([self._alloc_slots(r, 1) for r in reqs])
        lens = [r.total_len for r in reqs]
        return ForwardBatch(
            mode=ForwardMode.DECODE, reqs=list(reqs), extend_lens=[1] * len(reqs),
            prefix_lens=[n - 1 for n in lens], input_ids=torch.tensor([r.output_ids[-1] for r in reqs]),
            positions=torch.tensor(lens) - 1, out_cache_loc=slots,
            kv_indices=[self.req_pool.table[r.pool_row, :n] for r, n in zip(reqs, lens)],
            samples=[True] * len(reqs), input_logprob_targets=[[] for _ in reqs],
        )

    def _alloc_slots(self, req: Req, n: int) -> torch.Tensor:
        slots = self.kv_pool.alloc(n)
        # Admission reserved prompt + max_new_tokens, so this cannot fail.
        assert slots is not None, f"KV reservation broken for {req.rid}"
        self.req_pool.table[req.pool_row, req.kv_allocated_len : req.kv_allocated_len + n] = slots
        req.kv_allocated_len += n
        return slots

    def _input_logprob_targets(self, req: Req, start: int, n: int) -> list[int]:
        if not req.wants_input_logprobs:
            return []
        first = max(start + 1, req.logprob.logprob_start_len, 1)
        return list(range(first, min(start + n, req.prompt_len - 1) + 1))

    # -- finishing ------------------------------------------------------------------
    def _finish_checks(self, reqs: list[Req], deltas: list[RequestDelta], newly_prefilled: bool) -> None:
        by_rid = {d.rid: d for d in deltas}
        for req in reqs:
            finish = check_finish(req, self.eos_ids, self.policy.context_len, self.detokenize)
            if finish is None:
                if newly_prefilled:
                    self.running.append(req)
                continue
            self.finish_request(req, finish)
            by_rid[req.rid].finish = finish
            by_rid[req.rid].completion_tokens = len(req.output_ids)

    def abort_request(self, req: Req, finish: FinishReason) -> None:
        """Synchronous loop: no result is pending between steps, so finishing now is exact."""
        if req in self.waiting:
            self.waiting.remove(req)
        self.finish_request(req, finish)

    def finish_request(self, req: Req, finish: FinishReason) -> None:
        """Every finish, for any reason, releases the row and every KV slot exactly once."""
        assert req.finish is None, f"{req.rid} finished twice"
        req.finish = finish
        req.finish_time = time.monotonic()
        if req in self.running:
            self.running.remove(req)
        if self.chunked_req is req:
            self.chunked_req = None
        self._release(req)

    def _release(self, req: Req) -> None:
        if req.pool_row is not None:
            self.kv_pool.free(self.req_pool.table[req.pool_row, : req.kv_allocated_len].clone())
            self.req_pool.free(req.pool_row)
            req.pool_row, req.kv_allocated_len = None, 0
        self.reserved_tokens -= req.reserved_tokens
        req.reserved_tokens = 0

    # -- accounting -----------------------------------------------------------------
    def check_integrity(self) -> None:
        """Pool accounting must equal what live requests hold; run when idle and in tests."""
        live = list(self.running) + ([self.chunked_req] if self.chunked_req else [])
        held = sum(r.kv_allocated_len for r in live)
        assert self.kv_pool.num_used == held, f"KV used {self.kv_pool.num_used} != held by live requests {held}"
        assert self.req_pool.num_rows - self.req_pool.num_free == len(live), "request rows leaked"
        assert self.reserved_tokens == sum(r.reserved_tokens for r in live), "KV reservation leaked"
