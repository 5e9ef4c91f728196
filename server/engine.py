"""`Engine`: the offline API. A background thread runs the scheduler; callers block on results.

    from server import Engine
    engine = Engine()                      # the built-in demo model
    out = engine.generate("Hello", sampling_params={"max_new_tokens": 8, "temperature": 0})
    engine.shutdown()

Results reach callers only from the log's durable callback (I5). Without `log_dir` the
engine logs to a temporary directory that `shutdown` removes.
"""
from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from commitlog import DoomSource, RequestRefusedError
from server.config import ServerArgs
from server.errors import EngineStoppedError, InvalidRequestError
from server.heap import freeze_startup_heap, thaw_heap
from server.openmp import DEFAULT_SPIN_COUNT, SPIN_COUNT_VAR, release_thread_pool, spin_count_chosen
from server.outputs import AbortAnswer, RequestDelta
from server.request import Req
from server.request_builder import GenerateCall, RequestBuilder
from server.response import CommittedView, format_output
from server.runtime import Runtime, build_runtime
from server.scheduler import Scheduler

log = structlog.get_logger("tokenledger.engine")

ENGINE_MIXED_CHUNK_DEFAULT = True  # the offline Engine's default for enable_mixed_chunk (the server's is False)


@dataclass(slots=True)
class _Abort:
    """Aborts `rids` (all live requests if None) in one go, between two steps."""

    rids: list[str] | None
    source: DoomSource
    reply: queue.Queue[tuple[AbortAnswer, BaseException | None]]
    count: queue.Queue[int]  # how many answers will come


class _Stop:
    pass


class _Waiter:
    def __init__(self, req: Req) -> None:
        self.req = req
        self.done = threading.Event()
        self.error: BaseException | None = None


class Engine:
    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        # Offline, throughput is what counts: the running decodes ride in each prefill chunk's forward
        # unless the caller says otherwise. Measured (docs/benchmarks.md, nineteenth session): +5 % offline
        # tok/s in 3 of 4 ABAB pairs; the server keeps it off, where it raised p99 TTFT by ~10 %.
        server_args.setdefault("enable_mixed_chunk", ENGINE_MIXED_CHUNK_DEFAULT)
        self.args = ServerArgs.from_kwargs(model_path=model_path, **server_args)
        self._ephemeral_log = self.args.log_dir is None
        log_dir = Path(self.args.log_dir or tempfile.mkdtemp(prefix="tokenledger-log-"))
        self._inbox: queue.Queue[Req | _Abort | _Stop] = queue.Queue()
        self._waiters: dict[str, _Waiter] = {}
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._stopping = False  # set on the loop's thread when a stop arrives; it then drains
        if not spin_count_chosen():
            log.warning("openmp_default_spin", detail=f"torch was imported before server, so its OpenMP workers "
                        f"spin 30x longer than tokenledger sets (on 2 vCPUs its setting gave 7-27 % more offline "
                        f"throughput). Import server first, or set {SPIN_COUNT_VAR}={DEFAULT_SPIN_COUNT}.")
        self.runtime: Runtime = build_runtime(self.args, log_dir, self._on_durable)
        self.tokenizer = self.runtime.tokenizer
        self._builder = RequestBuilder(self.tokenizer, self.runtime.limits, self.args.random_seed)
        freeze_startup_heap(collect_first=False)  # thawed at shutdown
        self._thread = threading.Thread(target=self._loop, name="tokenledger-scheduler", daemon=True)
        self._thread.start()

    @property
    def scheduler(self) -> Scheduler:
        return self.runtime.scheduler

    @property
    def log_dir(self) -> Path:
        return self.runtime.log_dir

    # -- public API -----------------------------------------------------------------
    def generate(
        self, prompt: str | list[str] | None = None, input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None, return_logprob: bool = False,
        top_logprobs_num: int = 0, logprob_start_len: int = -1, return_hidden_states: bool = False,
        rid: str | list[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        call = GenerateCall(prompt, input_ids, sampling_params, return_logprob, top_logprobs_num,
                            logprob_start_len, return_hidden_states, rid)
        specs, is_batch = self._builder.build(call)
        # Forwards run on the loop's thread, and only for what is submitted here: the caller's own OpenMP
        # pool (from building the model in __init__, or its own parallel torch work since, such as a
        # baseline in the same process) is ended first, so the loop's is the only one (server.openmp).
        release_thread_pool()
        waiters = self._submit([Req.from_spec(s) for s in specs])
        for w in waiters:
            w.done.wait()
        for w in waiters:
            if isinstance(w.error, InvalidRequestError):
                raise w.error  # this request was refused; the engine goes on
            if w.error is not None:
                raise EngineStoppedError(f"the engine stopped before {w.req.rid} finished: {w.error}") from w.error
        outputs = [format_output(CommittedView.of(w.req), self.tokenizer) for w in waiters]
        return outputs if is_batch else outputs[0]

    def abort(self, rid: str, source: str = "api") -> dict[str, Any]:
        """`{rid, status: aborted|already_finished|unknown, completion_tokens, lsn}`; final once returned."""
        return self._abort([rid], source)[0]

    def abort_all(self, source: str = "api") -> list[dict[str, Any]]:
        """Aborts every live request at once: none of them takes another step."""
        return self._abort(None, source)

    def _abort(self, rids: list[str] | None, source: str) -> list[dict[str, Any]]:
        reply: queue.Queue[tuple[AbortAnswer, BaseException | None]] = queue.Queue()
        count: queue.Queue[int] = queue.Queue()
        self._put(_Abort(rids, DoomSource(source), reply, count))
        answers = []
        for _ in range(count.get()):
            answer, error = reply.get()
            if error is not None:
                raise EngineStoppedError(f"the abort of {answer.rid} could not be logged: {error}") from error
            answers.append(answer.to_dict())
        return answers

    def shutdown(self) -> None:
        """Stops the loop, aborts what is still running (logged), writes SERVER_STOP."""
        if self._thread.is_alive():
            self._inbox.put(_Stop())
            self._thread.join()
        ledger = self.scheduler.ledger
        if not ledger.wal.closed:
            ledger.close()
        self._fail_waiters(EngineStoppedError("the engine was shut down"))
        thaw_heap()
        if self._ephemeral_log:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- plumbing -------------------------------------------------------------------
    def _submit(self, reqs: list[Req]) -> list[_Waiter]:
        waiters = [_Waiter(r) for r in reqs]
        with self._lock:
            taken = [r.rid for r in reqs if r.rid in self._waiters]
            if taken:
                raise InvalidRequestError(f"rid {taken[0]!r} is already in use by a live request", "rid")
            self._waiters.update((w.req.rid, w) for w in waiters)
        for r in reqs:
            self._put(r)
        return waiters

    def _put(self, item: Req | _Abort | _Stop) -> None:
        if self._failure is not None or not self._thread.is_alive():
            raise EngineStoppedError("the engine is not running (shut down or failed)")
        self._inbox.put(item)

    def _loop(self) -> None:
        sched = self.scheduler
        try:
            while self._drain_inbox(block=sched.is_idle and not self._stopping):
                if not sched.is_idle:
                    sched.run_step()
                if sched.is_idle:
                    sched.check_integrity()
                    if self._stopping:
                        return  # drained: every request ended logged, every KV slot is back
        except BaseException as exc:  # the loop must never die silently
            log.exception("scheduler_failed")
            self._failure = exc
            self._fail_waiters(exc)

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued commands; False once the engine failed. A stop aborts what is live; the loop drains."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return self._failure is None
        while True:
            if isinstance(item, _Stop):
                self._stop_now()
            elif isinstance(item, Req) and self._stopping:
                self._refuse(item, EngineStoppedError("the engine was shut down before this request started"))
            elif isinstance(item, Req):
                self._add(item)
            else:
                self._abort_now(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return self._failure is None

    def _stop_now(self) -> None:
        """Shutdown: abort every live request, logged (source shutdown); the loop then drains."""
        self._stopping = True
        for rid in list(self.scheduler.reqs):
            self.scheduler.abort(rid, DoomSource.SHUTDOWN, lambda _a, _e: None, "engine shutdown")

    def _refuse(self, req: Req, error: BaseException) -> None:
        with self._lock:
            waiter = self._waiters.pop(req.rid, None)
        if waiter is not None:
            waiter.error = error
            waiter.done.set()

    def _add(self, req: Req) -> None:
        """A request the scheduler refuses fails alone (its caller gets the error); the loop goes on."""
        try:
            self.scheduler.add_request(req)
        except Exception as exc:  # noqa: BLE001 - refused before BEGIN: nothing logged, nothing held
            param = "rid" if isinstance(exc, RequestRefusedError) else None
            self._refuse(req, InvalidRequestError(f"the request was refused: {exc}", param))

    def _abort_now(self, item: _Abort) -> None:
        rids = list(self.scheduler.reqs) if item.rids is None else item.rids
        item.count.put(len(rids))
        reply = item.reply
        for rid in rids:
            self.scheduler.abort(rid, item.source, lambda a, e: reply.put((a, e)), flush=False)
        self.scheduler.settle_aborts(wait=True)  # one group for them all, answered once durable

    def _on_durable(self, deltas: list[RequestDelta], error: BaseException | None) -> None:
        """Runs on the log writer's thread: the only place results are released (I5)."""
        if error is not None:
            self._failure = error
            self._fail_waiters(error)
            return
        for delta in deltas:
            if delta.finish is None:
                continue
            with self._lock:
                waiter = self._waiters.pop(delta.rid, None)
            if waiter is not None:
                waiter.done.set()

    def _fail_waiters(self, error: BaseException) -> None:
        with self._lock:
            waiters, self._waiters = list(self._waiters.values()), {}
        for w in waiters:
            w.error = error
            w.done.set()
