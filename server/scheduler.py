"""The scheduler: waiting queue, running batch, prefill-first policy, chunked prefill, and
the overlap loop.

Overlap (the default): `run_step` launches step N+1's forward *before* processing step N's
result. Tests drive the same pieces one at a time (`launch_next`, `process_oldest`) to stop
inside that window. KV for a request is *reserved* in full (prompt + max_new_tokens) at
admission, so decode never runs out of slots; a request that does not fit waits.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from server.batch_builder import BatchBuilder
from server.finish import Detokenize, check_finish
from server.forward_batch import ForwardBatch, ForwardMode
from server.memory import ReqToTokenPool, TokenToKVPool
from server.model_runner import ForwardHandle, ModelRunner
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
    overlap: bool = True

    @property
    def prefill_budget(self) -> int:
        return self.chunked_prefill_size if self.chunked_prefill_size > 0 else self.max_prefill_tokens

    @property
    def future_slots(self) -> int:
        # At most two batches' tokens are unresolved at once (launched N+1, pending N).
        return 4 * self.max_running_requests + 16


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
        self.builder = BatchBuilder(req_pool, kv_pool, policy.future_slots)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []  # prefill fully launched: candidates for decode
        self.chunked_req: Req | None = None  # mid-way through a chunked prefill
        self.inflight: deque[ForwardHandle] = deque()  # launched, result not yet processed
        self.outbox: list[RequestDelta] = []
        self.reserved_tokens = 0
        self.stats = StepStats()

    # -- queue ----------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        self.waiting.append(req)

    @property
    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req or self.inflight)

    def live_requests(self) -> list[Req]:
        live = {id(r): r for r in self.running}
        if self.chunked_req is not None:
            live[id(self.chunked_req)] = self.chunked_req
        for handle in self.inflight:
            live.update((id(r), r) for r in handle.batch.reqs if not r.is_finished)
        return list(live.values())

    # -- the loop -------------------------------------------------------------------
    def run_step(self) -> list[RequestDelta]:
        """One iteration: launch the next forward, then process results it may overtake."""
        launched = self.launch_next()
        keep = 1 if (self.policy.overlap and launched) else 0
        while len(self.inflight) > keep:
            self.process_oldest()
        out, self.outbox = self.outbox, []
        return out

    def launch_next(self) -> ForwardHandle | None:
        batch = self.next_batch()
        if batch is None:
            return None
        for req, sampled in zip(batch.reqs, batch.samples):
            req.inflight_batches += 1
            req.inflight_tokens += sampled
        started = time.perf_counter()
        handle = self.runner.launch(batch)
        self.stats.record(batch.mode, batch.num_tokens, time.perf_counter() - started)
        self.inflight.append(handle)
        return handle

    def process_oldest(self) -> None:
        handle = self.inflight.popleft()
        batch, result = handle.batch, handle.result()
        for req, sampled in zip(batch.reqs, batch.samples):
            req.inflight_batches -= 1
            req.inflight_tokens -= sampled
        if batch.mode is ForwardMode.EXTEND:
            sampled_reqs = process_extend_result(batch, result, self.outbox)
        else:
            sampled_reqs = process_decode_result(batch, result, self.outbox)
        self._finish_checks(sampled_reqs)

    def next_batch(self) -> ForwardBatch | None:
        extend = self._admit_for_extend()
        if extend:
            batch = self.builder.extend(extend)
            for req, n in extend:
                req.scheduled_prefill_len += n
                if req.scheduled_prefill_len == req.prompt_len:
                    self.running.append(req)  # merged into decode at schedule time
            return batch
        decodable = [r for r in self.running if self._can_decode(r)]
        return self.builder.decode(decodable) if decodable else None

    def _can_decode(self, req: Req) -> bool:
        # Never schedule a token the finish check would refuse: length limits are known ahead.
        n = req.scheduled_tokens
        return not req.is_finished and n < req.params.max_new_tokens and req.prompt_len + n < self.policy.context_len

    # -- admission ------------------------------------------------------------------
    def _admit_for_extend(self) -> list[tuple[Req, int]]:
        budget = self.policy.prefill_budget
        chosen: list[tuple[Req, int]] = []
        if self.chunked_req is not None:
            req, self.chunked_req = self.chunked_req, None
            chosen.append((req, min(req.prompt_len - req.scheduled_prefill_len, budget)))
            budget -= chosen[-1][1]
        # The request pool has one row per running request: a free row is the running cap.
        while self.waiting and budget > 0:
            req = self.waiting[0]
            if not self._reserve(req):
                break  # head-of-line waits for memory; FIFO keeps admission fair
            self.waiting.popleft()
            chosen.append((req, min(req.prompt_len, budget)))
            budget -= chosen[-1][1]
        for req, n in chosen:
            if req.scheduled_prefill_len + n < req.prompt_len:
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

    # -- finishing ------------------------------------------------------------------
    def _finish_checks(self, reqs: list[Req]) -> None:
        by_rid = {d.rid: d for d in self.outbox}
        for req in reqs:
            finish = check_finish(req, self.eos_ids, self.policy.context_len, self.detokenize)
            if finish is not None:
                self.finish_request(req, finish)
                by_rid[req.rid].finish = finish
                by_rid[req.rid].completion_tokens = len(req.output_ids)

    def abort_request(self, req: Req, finish: FinishReason) -> None:
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
        # Slots a still-pending forward writes into are safe to free: forwards run in launch
        # order, so any later allocation of them is written after that forward.
        if req.pool_row is not None:
            self.kv_pool.free(self.req_pool.table[req.pool_row, : req.kv_allocated_len].clone())
            self.req_pool.free(req.pool_row)
            req.pool_row, req.kv_allocated_len = None, 0
        self.reserved_tokens -= req.reserved_tokens
        req.reserved_tokens = 0

    # -- accounting -----------------------------------------------------------------
    def check_integrity(self) -> None:
        """Pool accounting must equal what live requests hold; run when idle and in tests."""
        live = self.live_requests()
        held = sum(r.kv_allocated_len for r in live)
        assert self.kv_pool.num_used == held, f"KV used {self.kv_pool.num_used} != held by live requests {held}"
        assert self.req_pool.num_rows - self.req_pool.num_free == len(live), "request rows leaked"
        assert self.reserved_tokens == sum(r.reserved_tokens for r in live), "KV reservation leaked"
