"""`Engine`: the offline API. A background thread runs the scheduler; callers block on results.

    from server import Engine
    engine = Engine()                      # the built-in demo model
    out = engine.generate("Hello", {"max_new_tokens": 8, "temperature": 0})
    engine.shutdown()
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import structlog

from server.config import ServerArgs
from server.errors import EngineStoppedError, InvalidRequestError
from server.outputs import RequestDelta
from server.request import FinishKind, FinishReason, Req
from server.request_builder import GenerateCall, RequestBuilder
from server.response import format_output
from server.runtime import Runtime, build_runtime

log = structlog.get_logger("tokenledger.engine")


@dataclass(slots=True)
class _Submit:
    req: Req


@dataclass(slots=True)
class _Abort:
    rid: str
    reply: queue.Queue[dict[str, Any]]


class _Stop:
    pass


class _Waiter:
    def __init__(self, req: Req) -> None:
        self.req = req
        self.done = threading.Event()
        self.error: BaseException | None = None


class Engine:
    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        self.args = ServerArgs.from_kwargs(model_path=model_path, **server_args)
        self.runtime: Runtime = build_runtime(self.args)
        self.tokenizer = self.runtime.tokenizer
        self._builder = RequestBuilder(self.tokenizer, self.runtime.limits, self.args.random_seed)
        self._inbox: queue.Queue[_Submit | _Abort | _Stop] = queue.Queue()
        self._waiters: dict[str, _Waiter] = {}
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="tokenledger-scheduler", daemon=True)
        self._thread.start()

    @property
    def scheduler(self):  # -> Scheduler; for tests and metrics
        return self.runtime.scheduler

    # -- public API -----------------------------------------------------------------
    def generate(
        self, prompt: str | list[str] | None = None, input_ids: list[int] | list[list[int]] | None = None,
        sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None, return_logprob: bool = False,
        top_logprobs_num: int = 0, logprob_start_len: int = -1, return_hidden_states: bool = False,
        rid: str | list[str] | None = None,
    ) -> dict[str, Any] | list[dict[str, Any]]:
        call = GenerateCall(prompt, input_ids, sampling_params, return_logprob, top_logprobs_num,
                            logprob_start_len, return_hidden_states, rid)
        reqs, is_batch = self._builder.build(call)
        waiters = [self._submit(r) for r in reqs]
        for w in waiters:
            w.done.wait()
            if w.error is not None:
                raise EngineStoppedError(f"the scheduler stopped: {w.error}") from w.error
        outputs = [format_output(w.req, self.tokenizer) for w in waiters]
        return outputs if is_batch else outputs[0]

    def abort(self, rid: str) -> dict[str, Any]:
        reply: queue.Queue[dict[str, Any]] = queue.Queue()
        self._put(_Abort(rid, reply))
        return reply.get()

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(_Stop())
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- plumbing -------------------------------------------------------------------
    def _submit(self, req: Req) -> _Waiter:
        waiter = _Waiter(req)
        with self._lock:
            if req.rid in self._waiters:
                raise InvalidRequestError(f"rid {req.rid!r} is already in use by a live request", "rid")
            self._waiters[req.rid] = waiter
        self._put(_Submit(req))
        return waiter

    def _put(self, item: _Submit | _Abort | _Stop) -> None:
        if self._failure is not None or not self._thread.is_alive():
            raise EngineStoppedError("the engine is not running (shut down or failed)")
        self._inbox.put(item)

    def _loop(self) -> None:
        sched = self.runtime.scheduler
        try:
            while True:
                if not self._drain_inbox(block=sched.is_idle):
                    break
                self._deliver(sched.run_step())
                if sched.is_idle:
                    sched.check_integrity()
        except BaseException as exc:  # the loop must never die silently
            log.exception("scheduler_failed")
            self._failure = exc
        self._fail_waiters(self._failure or EngineStoppedError("engine shut down"))

    def _drain_inbox(self, block: bool) -> bool:
        """Apply queued commands; False once a stop was received."""
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if isinstance(item, _Stop):
                return False
            if isinstance(item, _Submit):
                self.runtime.scheduler.add_request(item.req)
            else:
                item.reply.put(self._abort_now(item.rid))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _abort_now(self, rid: str) -> dict[str, Any]:
        waiter = self._waiters.get(rid)
        if waiter is None:
            return {"rid": rid, "status": "unknown", "completion_tokens": 0}
        req = waiter.req
        if req.finish is not None:
            return {"rid": rid, "status": "already_finished", "completion_tokens": len(req.output_ids)}
        self.runtime.scheduler.abort_request(req, FinishReason(FinishKind.ABORT, message="aborted by request"))
        self._deliver([RequestDelta(rid=rid, finish=req.finish, completion_tokens=len(req.output_ids))])
        return {"rid": rid, "status": "aborted", "completion_tokens": len(req.output_ids)}

    def _deliver(self, deltas: list[RequestDelta]) -> None:
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
