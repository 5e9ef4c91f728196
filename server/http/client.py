"""The front's side of the ZMQ link: spawns the scheduler process, sends requests, routes
durable deltas to per-request streams, and notices when the scheduler dies."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import zmq
import zmq.asyncio

from server.config import ServerArgs
from server.errors import EngineStoppedError, TokenLedgerError
from server.messages import (
    AbortMsg,
    AbortReplyMsg,
    DeltasMsg,
    FatalMsg,
    FlushCacheMsg,
    FlushCacheReplyMsg,
    GenerateMsg,
    Message,
    ReadyMsg,
    RejectMsg,
    ShutdownMsg,
    StatsMsg,
    StoppedMsg,
    decode,
    encode,
)
from server.outputs import AbortAnswer, RequestDelta
from server.request import RequestSpec


class RequestRejected(TokenLedgerError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.http_status = status
        self.error_type = "conflict" if status == 409 else "service_unavailable"


_END = object()
# Aborted rids whose durable time is remembered for `GET /requests/{rid}`: ~100 bytes each.
ABORT_TIMES_KEPT = 4096


@dataclass(eq=False)
class Submission:
    """One accepted request: where its deltas arrive, and whether the scheduler has finished it."""

    rid: str
    queue: asyncio.Queue[object] = field(default_factory=asyncio.Queue)
    finished: bool = False  # a finish delta, a rejection or a scheduler failure has arrived
    abandoned: bool = False  # its reader went away and an abort (source disconnect) was sent


class SchedulerClient:
    def __init__(self, args: ServerArgs, log_dir: Path) -> None:
        self.args = args
        self.log_dir = log_dir
        self._ipc_dir = tempfile.mkdtemp(prefix="tokenledger-ipc-")
        inbound, outbound = f"ipc://{self._ipc_dir}/to-scheduler", f"ipc://{self._ipc_dir}/to-front"
        self._ctx = zmq.asyncio.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.bind(inbound)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(outbound)
        self.process = multiprocessing.get_context("spawn").Process(
            target=scheduler_entry, args=(args, str(log_dir), inbound, outbound), name="tokenledger-scheduler")
        self.ready: ReadyMsg | None = None
        self.failure: str | None = None
        self.stopped = asyncio.Event()
        self.on_stats: list = []  # callbacks taking a StatsMsg
        self.on_abort_finished: list = []  # callbacks taking seconds from an abort's send to its finish here
        self._abort_sent: dict[str, float] = {}  # live rid -> when its first abort was sent (monotonic)
        self._streams: dict[str, Submission] = {}  # accepted and not yet finished
        # rid -> wall clock when its abort's finish became durable (the last ABORT_TIMES_KEPT aborts)
        self.abort_durable_times: OrderedDict[str, float] = OrderedDict()
        self._tickets = itertools.count(1)
        self._abort_futures: dict[int, asyncio.Future[list[AbortAnswer]]] = {}
        self._flush_futures: dict[int, asyncio.Future[FlushCacheReplyMsg]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self) -> None:
        """Starts the scheduler process; call early so its start-up overlaps the front's."""
        self.process.start()

    async def start(self, timeout_s: float = 600.0) -> ReadyMsg:
        """Waits until the scheduler has loaded the model and opened the log."""
        if self.process.pid is None:
            self.spawn()
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._watch_process())]
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.ready is None:
            if self.failure is not None:
                raise EngineStoppedError(f"the scheduler failed to start: {self.failure}")
            if asyncio.get_running_loop().time() > deadline:
                raise EngineStoppedError("the scheduler did not become ready in time")
            await asyncio.sleep(0.02)
        return self.ready

    @property
    def is_healthy(self) -> bool:
        return self.ready is not None and self.failure is None and not self.stopped.is_set()

    # -- requests ---------------------------------------------------------------------
    def is_live(self, rid: str) -> bool:
        return rid in self._streams

    def submit(self, spec: RequestSpec) -> Submission:
        """Accepts the request now: its rid is live from this call on, and its GenerateMsg is
        queued on the PUSH socket before this returns. An abort sent later travels the same
        socket, so the scheduler always sees the generate first (I2: a waiting request is
        removed without any forward) and an accepted request can never be "unknown" to it."""
        if not self.is_healthy:
            raise EngineStoppedError(self.failure or "the scheduler is not running")
        if spec.rid in self._streams:
            raise RequestRejected(f"rid {spec.rid!r} is already in use by a live request", 409)
        message = encode(GenerateMsg.from_spec(spec))  # first: a message that cannot be sent leaves no live rid
        submission = Submission(spec.rid)
        self._streams[spec.rid] = submission
        self.abort_durable_times.pop(spec.rid, None)  # a new incarnation: an older abort's time is not its own
        # Not awaited: pyzmq queues sends in call order, so the order is fixed here, now.
        sent = cast("asyncio.Future[object]", self._push.send(message))  # zmq.asyncio: a Future, typed Awaitable
        sent.add_done_callback(lambda future: self._on_sent(submission, future))
        return submission

    async def follow(self, submission: Submission) -> AsyncIterator[RequestDelta]:
        """Yields a submitted request's durable deltas; the last one carries `finish`."""
        while (item := await submission.queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, RequestDelta)
            yield item

    async def generate(self, spec: RequestSpec) -> AsyncIterator[RequestDelta]:
        """`submit` then `follow`, for callers that start reading at once."""
        async for delta in self.follow(self.submit(spec)):
            yield delta

    def _on_sent(self, submission: Submission, future: asyncio.Future[object]) -> None:
        if future.cancelled() or future.exception() is None:
            return
        if self._streams.get(submission.rid) is submission:
            del self._streams[submission.rid]
            self._abort_sent.pop(submission.rid, None)
        submission.queue.put_nowait(EngineStoppedError(f"the request could not be sent: {future.exception()}"))

    async def abort(self, rids: list[str], source: str, abort_all: bool = False) -> list[AbortAnswer]:
        return await self.send_abort(rids, source, abort_all)

    def send_abort(self, rids: list[str], source: str, abort_all: bool = False) -> asyncio.Future[list[AbortAnswer]]:
        """Sends the abort now, within the caller's turn of the event loop; the future gets the
        scheduler's answers. Not from a task of its own: on a front streaming to many clients, a task's
        first step came one or more loop turns later (p90 9 ms, p99 18 ms after a disconnect was seen,
        issue 11's abort latency). zmq.asyncio tries a non-blocking send at once and queues only if
        the socket is full."""
        if not self.is_healthy:
            raise EngineStoppedError(self.failure or "the scheduler is not running")
        ticket = next(self._tickets)
        answers: asyncio.Future[list[AbortAnswer]] = asyncio.get_running_loop().create_future()
        self._abort_futures[ticket] = answers
        sent = time.monotonic()
        timed = [rid for rid in (self._streams if abort_all else rids) if rid in self._streams and rid not in self._abort_sent]
        for rid in timed:
            self._abort_sent[rid] = sent

        def on_sent(sending: asyncio.Future[Any]) -> None:
            error = EngineStoppedError("the abort could not be sent") if sending.cancelled() else sending.exception()
            if error is None:
                return
            for rid in timed:
                self._abort_sent.pop(rid, None)
            self._abort_futures.pop(ticket, None)
            if not answers.done():
                answers.set_exception(error)

        sending = asyncio.ensure_future(self._push.send(encode(AbortMsg(ticket, rids, source, abort_all))))
        sending.add_done_callback(on_sent)
        return answers

    async def flush_cache(self) -> FlushCacheReplyMsg:
        """Asks the scheduler to drop its cached KV; it answers once, at once (never waits for requests)."""
        if not self.is_healthy:
            raise EngineStoppedError(self.failure or "the scheduler is not running")
        ticket = next(self._tickets)
        future: asyncio.Future[FlushCacheReplyMsg] = asyncio.get_running_loop().create_future()
        self._flush_futures[ticket] = future
        await self._push.send(encode(FlushCacheMsg(ticket)))
        return await future

    async def shutdown(self, grace_s: float) -> None:
        if self.process.is_alive():
            await self._push.send(encode(ShutdownMsg(grace_s)))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), grace_s + 30)
        await asyncio.to_thread(self.process.join, 10)
        self.close()

    def close(self) -> None:
        if self._ctx.closed:
            return
        for task in self._tasks:
            task.cancel()
        if self.process.is_alive():
            self.process.kill()
        self._push.close(0)
        self._pull.close(0)
        self._ctx.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)

    # -- inbound ----------------------------------------------------------------------
    async def _receive_loop(self) -> None:
        while True:
            self._dispatch(decode(await self._pull.recv()))

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, DeltasMsg):
            for delta in msg.deltas:
                submission = self._streams.get(delta.rid)
                if submission is not None:
                    submission.queue.put_nowait(delta)
                    if delta.finish is not None:
                        sent = self._abort_sent.pop(delta.rid, None)
                        # A request that finished by itself before the abort won is not an abort's latency.
                        if sent is not None and delta.finish.get("type") == "abort":
                            for callback in self.on_abort_finished:
                                callback(time.monotonic() - sent)
                        # Finished at the scheduler: no longer live, whether or not anyone reads it.
                        submission.finished = True
                        submission.queue.put_nowait(_END)
                        del self._streams[delta.rid]
                if delta.finish is not None and delta.finish.get("type") == "abort":
                    self._note_abort(delta.rid, msg.durable_time)
        elif isinstance(msg, AbortReplyMsg):
            future = self._abort_futures.pop(msg.ticket, None)
            if future is not None and not future.done():
                future.set_result(msg.answers)
        elif isinstance(msg, FlushCacheReplyMsg):
            flushed = self._flush_futures.pop(msg.ticket, None)
            if flushed is not None and not flushed.done():
                flushed.set_result(msg)
        elif isinstance(msg, RejectMsg):
            submission = self._streams.pop(msg.rid, None)
            self._abort_sent.pop(msg.rid, None)
            if submission is not None:
                submission.finished = True
                submission.queue.put_nowait(RequestRejected(msg.message, msg.status))
        elif isinstance(msg, StatsMsg):
            for callback in self.on_stats:
                callback(msg)
        elif isinstance(msg, ReadyMsg):
            self.ready = msg
        elif isinstance(msg, FatalMsg):
            self._fail(msg.message)
        elif isinstance(msg, StoppedMsg):
            self.stopped.set()

    def _note_abort(self, rid: str, durable_time: float) -> None:
        self.abort_durable_times[rid] = durable_time
        self.abort_durable_times.move_to_end(rid)
        while len(self.abort_durable_times) > ABORT_TIMES_KEPT:
            self.abort_durable_times.popitem(last=False)

    async def _watch_process(self) -> None:
        while self.process.is_alive():
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)  # let its last messages arrive
        if not self.stopped.is_set():
            self._fail(self.failure or f"the scheduler process exited with code {self.process.exitcode}")
        self.stopped.set()

    def _fail(self, message: str) -> None:
        self.failure = message
        error = EngineStoppedError(f"the scheduler stopped: {message}")
        for submission in self._streams.values():
            submission.finished = True
            submission.queue.put_nowait(error)
        self._streams.clear()
        self._abort_sent.clear()
        pending: list[asyncio.Future[Any]] = [*self._abort_futures.values(), *self._flush_futures.values()]
        for future in pending:
            if not future.done():
                future.set_exception(error)
        self._abort_futures.clear()
        self._flush_futures.clear()


def scheduler_entry(args: ServerArgs, log_dir: str, inbound: str, outbound: str) -> None:
    """The spawned process's target: imports the scheduler (and torch) only over there."""
    from server.scheduler_process import scheduler_main

    scheduler_main(args, log_dir, inbound, outbound)
