"""The scheduler: waiting queue, running batch, prefill-first policy, chunked prefill, the
overlap loop, and aborts.

Overlap (the default): `run_step` launches step N+1's forward *before* processing step N's
result. Tests drive the same pieces one at a time (`launch_next`, `process_oldest`,
`flush`) to stop inside that window. Every result goes through `result_processing`, the
commit boundary; every step's records are one group, and its deltas reach the output
side only from the group's durable callback (write-ahead, I5).

Structured output: a constrained request's mask for step N+1 needs step N's token accepted
by its matcher, which happens only when step N's result commits. So such a request never
decodes while a token of it is pending (`_can_decode`), and `run_step` processes pending
results before launching whenever a constrained request is waiting on one: those steps run
without overlap, which keeps their output identical to the non-overlap schedule. Penalized
requests (repetition/frequency/presence) follow the same rule: their token counts are
committed state too (`Req.reads_committed_history`).

Aborts likewise: when a doomed request still has a result pending, `run_step` processes the
pending results (its segment is discarded, I2) and flushes before it launches, so the abort's
FINISH reaches the client without waiting for one more forward.

The forward gate: `launch_next` runs the forward inside `forward_gate()`, a no-op by default. The
scheduler process passes one that releases its state lock for the forward's length, so an abort
that arrives mid-forward is served then (`settle_aborts`), not when the forward ends.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, wait
from contextlib import AbstractContextManager, nullcontext

from commitlog import CommitLogError, DoomSource, FinishReason, Ledger, UnknownRequestError
from commitlog.audit import finish_reason_object
from commitlog.wal import Durability
from server.batch_builder import BatchBuilder
from server.forward_batch import ForwardBatch
from server.grammar.compiler import GrammarCompiler
from server.grammar.reasoning import ReasoningParser
from server.memory import ReqToTokenPool, TokenToKVPool
from server.model_runner import ForwardHandle, ModelRunner
from server.outputs import AbortAnswer, AbortStatus, RequestDelta
from server.prefix_cache import PrefixCache
from server.radix_cache import RadixCache
from server.request import Req
from server.result_processing import FinishRules, process_result
from server.schedule_policy import SchedulePolicy, SchedulerCounters, StepStats

# Both are called on the log writer's thread once a group is durable, or with the error
# that stopped it from becoming durable (then nothing in it may be shown).
DeltaSink = Callable[[list[RequestDelta], "BaseException | None"], None]
AbortReply = Callable[[AbortAnswer, "BaseException | None"], None]


class Scheduler:
    def __init__(
        self, policy: SchedulePolicy, runner: ModelRunner, req_pool: ReqToTokenPool, kv_pool: TokenToKVPool,
        ledger: Ledger, rules: FinishRules, sink: DeltaSink, grammars: GrammarCompiler | None = None,
        reasoning: ReasoningParser | None = None, cache: RadixCache | None = None,
    ) -> None:
        self.policy = policy
        self.runner = runner
        self.req_pool = req_pool
        self.kv_pool = kv_pool
        self.ledger = ledger
        self.rules = rules
        self.sink = sink  # receives each durable group's deltas (on the log writer's thread)
        self.builder = BatchBuilder(req_pool, kv_pool, policy.future_slots)
        self.reqs: dict[str, Req] = {}  # every live request: waiting, prefilling or decoding
        self.waiting: deque[Req] = deque()
        self.compiling: list[Req] = []  # constrained requests whose grammar is being compiled
        self.running: list[Req] = []  # prefill fully launched: candidates for decode
        self.chunked_req: Req | None = None  # mid-way through a chunked prefill
        self.inflight: deque[ForwardHandle] = deque()  # launched, result not yet processed
        self.outbox: list[RequestDelta] = []
        # Aborts staged with `flush=False`: answered once `settle_aborts` made their group durable.
        self.unanswered_aborts: list[tuple[AbortReply, AbortAnswer]] = []
        self.reserved_tokens = 0
        self.stats = StepStats()
        self.counters = SchedulerCounters()
        self.grammars = grammars  # None: constrained requests are refused at add_request
        self.reasoning = reasoning
        self.num_grammar_syncs = 0  # steps that processed results early for a constrained request
        self.num_abort_syncs = 0  # steps that processed results early to finish an aborted request
        self.prefix = PrefixCache(kv_pool, req_pool, cache)  # tree None: --disable-radix-cache
        # Entered for each forward's length (module docstring); the forward reads only its batch.
        self.forward_gate: Callable[[], AbstractContextManager[object]] = nullcontext

    # -- arrivals -------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        """Logs BEGIN; the caller has checked that the rid is not live. A constrained request
        waits for its grammar, compiled off this thread, before it can be admitted.

        Raises RequestRefusedError (nothing logged, nothing held) when the ledger refuses the
        rid; once BEGIN is staged, every failure ends the request with a logged abort."""
        spec = req.params.grammar
        req.reasoning = self.reasoning
        req.state = self.ledger.begin(req.rid, req.prompt_ids, req.begin_params(),
                                      grammar_spec=spec.to_log() if spec else None)
        self.reqs[req.rid] = req
        if spec is None:
            self.waiting.append(req)
        elif self.grammars is None:
            self._finish_now(req, "structured output is not available on this server")
        else:
            try:
                req.grammar_future = self.grammars.submit(spec)
            except Exception as exc:  # noqa: BLE001 - begun and logged: it must end logged, not leak
                self._finish_now(req, f"its grammar could not be compiled: {type(exc).__name__}: {exc}")
                return
            self.compiling.append(req)

    @property
    def is_idle(self) -> bool:
        return not (self.reqs or self.inflight)

    # -- the loop -------------------------------------------------------------------
    def run_step(self) -> None:
        """One iteration: launch the next forward, process the result it overtook, flush."""
        self.settle_aborts(wait=True)
        if self.inflight and self._grammar_waits_on_pending():  # none left if the aborts settled them
            self.num_grammar_syncs += 1
            self._process_all_pending()
        launched = self.launch_next()
        keep = 1 if (self.policy.overlap and launched) else 0
        while len(self.inflight) > keep:
            self.process_oldest()
        self.flush()
        if launched is None and not self.inflight:
            self._wait_for_grammars()

    def launch_next(self) -> ForwardHandle | None:
        batch = self.next_batch()
        if batch is None:
            return None
        for req, sampled in zip(batch.reqs, batch.samples):
            req.inflight_batches += 1
            req.inflight_tokens += sampled
        # The schedule, for `replay --reexecute`: staged before this forward's results (launch order).
        self.ledger.log_forward(batch.mode.value, [r.rid for r in batch.reqs], batch.prefix_lens, batch.extend_lens,
                                len(self.inflight))
        with self.forward_gate():
            started = time.perf_counter()  # the forward's time only, not a wait for the lock after it
            handle = self.runner.launch(batch)
            elapsed = time.perf_counter() - started
        self.stats.record(batch.mode, batch.num_tokens, elapsed)
        self.counters.step_seconds.append(elapsed)
        self.inflight.append(handle)
        return handle

    def process_oldest(self) -> None:
        handle = self.inflight.popleft()
        batch, result = handle.batch, handle.result()
        for req, sampled in zip(batch.reqs, batch.samples):
            req.inflight_batches -= 1
            req.inflight_tokens -= sampled
        for req in process_result(batch, result, self.ledger, self.rules, self.outbox):
            self.counters.discarded_results += req.is_doomed
            self._on_finished(req)
        for req in batch.reqs:
            if req.state.kv_committed_len == req.prompt_len and not req.is_finished:
                self._adopt_prompt(req)  # its prefill just committed: shareable from now on

    def flush(self, then: Callable[[BaseException | None], None] | None = None) -> int | None:
        """Write the step's records as one group; its deltas go out once it is durable, and `then`
        runs after them. None if nothing was staged (`then` is not called)."""
        deltas, self.outbox = self.outbox, []
        self.counters.generated_tokens += sum(len(d.token_ids) for d in deltas)
        started = time.perf_counter()

        def on_durable(_lsn: int, error: BaseException | None) -> None:
            self.counters.wal_commit_seconds.append(time.perf_counter() - started)
            self.sink(deltas, error)
            if then is not None:
                then(error)

        return self.ledger.flush(on_durable)

    # -- batch selection: the admission guard lives here ----------------------------
    def next_batch(self) -> ForwardBatch | None:
        self.admit_compiled_grammars()
        extend = self._admit_for_extend()
        if extend:
            # Mixed: the running decodes ride along, chosen before this chunk's finished prompts join them.
            decoding = [r for r in self.running if self._can_decode(r)] if self.policy.mixed_chunk else []
            batch = self.builder.mixed(extend, decoding) if decoding else self.builder.extend(extend)
            for req, n in extend:
                req.scheduled_prefill_len += n
                if req.scheduled_prefill_len == req.prompt_len:
                    self.running.append(req)  # merged into decode at schedule time
            return batch
        decodable = [r for r in self.running if self._can_decode(r)]
        return self.builder.decode(decodable) if decodable else None

    def _can_decode(self, req: Req) -> bool:
        # I2: a doomed request never enters a new batch (no optimistic step, no KV slot).
        # Length limits are known ahead, so no token the finish check would refuse is scheduled.
        # A constrained request's mask needs its previous token accepted, i.e. committed; a
        # penalized request's counts likewise hold committed tokens only.
        n = req.scheduled_tokens
        return (not req.is_doomed and not req.is_finished and n < req.params.max_new_tokens
                and req.prompt_len + n < self.policy.context_len
                and not (req.reads_committed_history and req.inflight_tokens))

    def _admit_for_extend(self) -> list[tuple[Req, int]]:
        budget = self.policy.prefill_budget
        chosen: list[tuple[Req, int]] = []
        if self.chunked_req is not None and not self.chunked_req.is_doomed:
            req, self.chunked_req = self.chunked_req, None
            chosen.append((req, min(req.prompt_len - req.scheduled_prefill_len, budget)))
            budget -= chosen[-1][1]
        prefilling = self._prefilling() + [r for r, _ in chosen]  # once a step; each admission joins it
        # The request pool has one row per running request: a free row is the running cap.
        while self.waiting and budget > 0:
            req = self.waiting[0]
            if self.prefix.should_wait(req, prefilling) or not self._reserve(req):
                break  # head-of-line waits for memory; FIFO keeps admission fair
            self.waiting.popleft()
            chosen.append((req, min(req.prompt_len - req.scheduled_prefill_len, budget)))
            prefilling.append(req)
            budget -= chosen[-1][1]
        for req, n in chosen:
            if req.scheduled_prefill_len + n < req.prompt_len:
                self.chunked_req = req  # at most one: the budget is spent once it is chunked
        return chosen

    def _reserve(self, req: Req) -> bool:
        """Admits `req` if memory allows: its row, and KV for its uncached prompt tail plus
        max_new_tokens, counting unlocked cache entries as free (they are evicted to make room)."""
        if self.req_pool.num_free == 0:
            return False
        prefix = self.prefix.lock_prefix(req)
        need = req.prompt_len - req.cached_len + req.params.max_new_tokens
        # Every reservation plus the cache must fit the pool.
        if not self.prefix.make_room(self.reserved_tokens + need + self.prefix.num_tokens - self.kv_pool.capacity):
            self.prefix.unlock_prefix(req)
            req.cached_len = 0  # not admitted: matched again when it is
            return False
        req.pool_row = self.req_pool.alloc()
        req.reserved_tokens = need
        self.reserved_tokens += need
        if prefix is not None:
            self.req_pool.table[req.pool_row, : req.cached_len] = prefix
            req.kv_allocated_len = req.scheduled_prefill_len = req.cached_len
        self.counters.prefix_hit_tokens += req.cached_len
        self.counters.prefix_query_tokens += req.prompt_len
        return True

    def _prefilling(self) -> list[Req]:
        """Admitted requests whose prompt KV has not committed yet."""
        reqs = self.running if self.chunked_req is None else [*self.running, self.chunked_req]
        return [r for r in reqs if r.state.kv_committed_len < r.prompt_len and not r.is_doomed]

    def _adopt_prompt(self, req: Req) -> None:
        adopted = self.prefix.adopt_prompt(req)
        # Adopted slots are the tree's now (locked): this request no longer reserves them.
        req.reserved_tokens -= adopted
        self.reserved_tokens -= adopted

    # -- aborts ---------------------------------------------------------------------
    def abort(self, rid: str, source: DoomSource, reply: AbortReply, reason: str | None = None,
              flush: bool = True) -> None:
        """Dooms `rid`. Waiting or idle: finished now. Result pending: that result is discarded.
        `flush=False` only stages it: the caller ends its burst of aborts with `settle_aborts`, so the
        ABORT_REQUESTED records, the pending results they discard and their FINISH records are one
        group (one fsync, not two in a row), and `reply` runs once that group is durable."""
        req = self.reqs.get(rid)
        if req is None or req.is_doomed:
            answer = self._answer_for_unlive(rid) if req is None else AbortAnswer(rid, AbortStatus.ABORTED, len(req.output_ids), req.abort_lsn)
            reply(answer, None)
            return
        self.ledger.doom(rid, reason or f"aborted ({source.value})", source)
        self.counters.aborts[source.value] += 1
        req.abort_lsn = self.ledger.staged_lsn()
        if req.inflight_batches == 0:
            # Waiting, or admitted with no result pending: nothing can arrive for it, finish now.
            if req in self.waiting:
                self.waiting.remove(req)
            if req in self.compiling:
                self.compiling.remove(req)
            self.ledger.finish(rid, FinishReason.ABORT)
            self.outbox.append(RequestDelta(rid, finish=finish_reason_object(req.state),
                                            completion_tokens=len(req.output_ids)))
            self._on_finished(req)
        answer = AbortAnswer(rid, AbortStatus.ABORTED, len(req.output_ids), req.abort_lsn)
        if not flush:
            self.unanswered_aborts.append((reply, answer))
            return
        # The outbox may hold more than this abort's finish: under the scheduler process, an abort
        # can arrive mid-forward, after a step staged deltas it has not flushed yet.
        if self.flush(lambda error: reply(answer, error)) is None:
            reply(answer, None)

    def settle_aborts(self, wait: bool = False) -> int | None:
        """An aborted request's result already launched is discarded now (I2: DISCARD, then its
        FINISH), with every other result pending, and the group flushed with the aborts staged by
        `abort(flush=False)`, which are answered once it is durable; the LSN, or None if there was
        nothing to settle. Overlapped, the finish would otherwise wait for one more forward (issue
        11's abort latency). A forward still running (the process serves aborts during one) is not
        waited for: a member finished by then has its segment skipped, as for a stop found late.
        `wait`: return once the group is durable, so the finish is not queued behind the next
        forward (on a CPU its threads took the log writer's cores: 30-70 ms). Not under `periodic`,
        where durable means the next timed sync."""
        discards = bool(self.inflight) and self._abort_waits_on_pending()
        if not (discards or self.unanswered_aborts):
            return None
        if discards:
            self.num_abort_syncs += 1
            self._process_all_pending()
        replies, self.unanswered_aborts = self.unanswered_aborts, []

        def answer(error: BaseException | None) -> None:
            for reply, abort_answer in replies:
                reply(abort_answer, error)

        lsn = self.flush(answer)
        if lsn is None:
            answer(None)
        elif wait and self.ledger.writer.durability is not Durability.PERIODIC:
            self.ledger.writer.wait_durable(lsn)
        return lsn

    def _answer_for_unlive(self, rid: str) -> AbortAnswer:
        try:
            state = self.ledger.read(lambda reader: reader.rebuild(rid))
        except UnknownRequestError:  # no record of it in the log: never begun here
            return AbortAnswer(rid, AbortStatus.UNKNOWN)
        except CommitLogError as exc:  # begun here, but its records cannot be trusted
            return AbortAnswer(rid, AbortStatus.CORRUPT, detail=str(exc))
        return AbortAnswer(rid, AbortStatus.ALREADY_FINISHED, len(state.output_ids), finish=finish_reason_object(state))

    # -- grammars -------------------------------------------------------------------
    def admit_compiled_grammars(self) -> None:
        """Compiled grammars become matchers and their requests join the waiting queue."""
        for req in [r for r in self.compiling if r.grammar_future is not None and r.grammar_future.done()]:
            self.compiling.remove(req)
            future, req.grammar_future = req.grammar_future, None
            assert self.grammars is not None and future is not None
            try:
                req.grammar = self.grammars.matcher(future.result())
            except Exception as exc:  # noqa: BLE001 - a compile failure ends this request only
                self._finish_now(req, f"grammar compilation failed: {exc}")
                continue
            self.waiting.append(req)

    def _wait_for_grammars(self) -> None:
        # Nothing to run but compiles: wait for one instead of spinning the loop.
        futures = [r.grammar_future for r in self.compiling if r.grammar_future is not None]
        if futures and not self.waiting:
            wait(futures, timeout=0.05, return_when=FIRST_COMPLETED)

    def _process_all_pending(self) -> None:
        """Processes every launched forward's result now: the next one runs without overlap."""
        while self.inflight:
            self.process_oldest()

    def _abort_waits_on_pending(self) -> bool:
        return any(r.is_doomed and r.inflight_batches for r in self.reqs.values())

    def _grammar_waits_on_pending(self) -> bool:
        return any(r.reads_committed_history and r.inflight_tokens and not r.is_doomed for r in self.running)

    def _finish_now(self, req: Req, reason: str) -> None:
        """Ends a request that never ran (no forward, no KV): FINISH(abort) with the reason."""
        self.ledger.finish(req.rid, FinishReason.ABORT, reason)
        self.outbox.append(RequestDelta(req.rid, finish=finish_reason_object(req.state), completion_tokens=0))
        self._on_finished(req)

    # -- finishing ------------------------------------------------------------------
    def _on_finished(self, req: Req) -> None:
        """Every finish, for any reason, releases the row and every KV slot exactly once (I4)."""
        req.finish_time = time.monotonic()
        del self.reqs[req.rid]
        if req in self.running:
            self.running.remove(req)
        if self.chunked_req is req:
            self.chunked_req = None
        # Slots a still-pending forward writes into are safe to free: forwards run in launch
        # order, so any later allocation of them is written after that forward (on CUDA, by
        # stream order: server/cuda_overlap.py says why).
        if req.pool_row is not None:
            self.prefix.release(req, self.req_pool.table[req.pool_row, : req.kv_allocated_len].clone())
            self.req_pool.free(req.pool_row)
            req.pool_row, req.kv_allocated_len = None, 0
        self.reserved_tokens -= req.reserved_tokens
        req.reserved_tokens = 0

    def flush_cache(self) -> bool:
        """Admin flush: empties the prefix cache. Refused (False) while requests are live, as SGLang
        does: their KV is committed state, never dropped behind their back."""
        if not self.is_idle:
            return False
        self.prefix.flush()
        return True

    # -- accounting -----------------------------------------------------------------
    @property
    def cache(self) -> RadixCache | None:
        """The radix tree of committed KV (None: --disable-radix-cache)."""
        return self.prefix.tree

    @property
    def kv_cached_tokens(self) -> int:
        return self.prefix.num_tokens

    @property
    def kv_live_tokens(self) -> int:
        """Slots held by live requests (the prefix cache's excluded): 0 after a drain (I4)."""
        return self.kv_pool.num_used - self.kv_cached_tokens

    def check_integrity(self) -> None:
        """Pool accounting must equal what live requests and the cache hold; run when idle and in tests."""
        live = list(self.reqs.values())
        held = sum(r.kv_allocated_len - r.owned_len for r in live)
        assert self.kv_live_tokens == held, f"KV used by live requests {self.kv_live_tokens} != held {held}"
        rows = sum(r.pool_row is not None for r in live)
        assert self.req_pool.num_rows - self.req_pool.num_free == rows, "request rows leaked"
        assert self.reserved_tokens == sum(r.reserved_tokens for r in live), "KV reservation leaked"
        self.prefix.check_integrity(live)
