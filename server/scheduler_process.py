"""The scheduler process: owns the model, the KV pools and the log; talks to the front over ZMQ.

Inbound (PULL): generate, abort, flush cache, shutdown. Outbound (PUSH, through one sender thread that
owns the socket): ready, durable deltas, abort replies, stats. Deltas are sent from the
log's durable callback, so the front never sees a token that is not in the log (I5).

Two threads share the scheduler, one lock between them. The loop holds it except while a forward
runs and while it idles; the receiver thread owns the inbound socket and handles each message
under the lock. So a message arriving mid-forward is handled then: an abort's pending result is
discarded and its FINISH flushed while the forward still runs (before, it waited for the forward,
a 512-token prefill being ~2 decode steps: issue 11's abort p99). Messages keep their order.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import structlog
import zmq

from commitlog import ChainHead, DoomSource, RequestRefusedError
from server.config import ServerArgs
from server.errors import TokenLedgerError
from server.heap import freeze_startup_heap
from server.log_setup import configure_logging
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
from server.request import Req
from server.runtime import Runtime, build_runtime

STATS_INTERVAL_S = 0.25
IDLE_POLL_MS = 50
LOCK_TRY_S = 0.002  # the receiver's wait for the loop's lock before it polls the socket again
# How often the chain head is logged (issue 10 C.15). A module constant until the flag
# `--chain-head-interval-s` (server/config.py, ops/server_args.py) exists; a log pipeline that keeps
# these lines can later prove with `verify --expect-head` that nothing before them was edited.
CHAIN_HEAD_INTERVAL_S = 60.0
ORPHAN_SEND_TIMEOUT_S = 2.0

log = structlog.get_logger("tokenledger.scheduler")


class Sender:
    """Owns the outbound socket. A message goes out on the caller's thread when nothing is queued
    before it; otherwise (or when the socket is full: the front is behind) it is queued, and the
    sender thread sends it and everything after it, in order.

    Before, every message went through the thread: a durable step's deltas (and an abort's final
    delta) waited for that thread to be woken and to get the GIL beside the forward, p90 4.5 ms
    (issue 11's abort latency). One thread uses the socket at a time: callers only under the lock
    and only while nothing is queued, the thread only while something is (`_queued` > 0)."""

    def __init__(self, ctx: zmq.Context, address: str) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # messages queued and not yet sent; guarded by `_lock`
        self._closed = False
        self._socket = ctx.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 2000)
        self._socket.connect(address)
        self._thread = threading.Thread(target=self._run, name="tokenledger-sender", daemon=True)
        self._thread.start()

    def send(self, msg: Message) -> None:
        data = encode(msg)
        with self._lock:
            if not (self._queued or self._closed):
                try:
                    self._socket.send(data, zmq.NOBLOCK)
                    return
                except zmq.Again:
                    pass  # the front is behind: the thread waits for room, never the caller
            self._queued += 1
            self._queue.put(data)

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued, then close. With a `timeout` (the front is gone, nobody reads), a
        thread stuck on a full socket is left behind: it is a daemon, and the socket stays its own."""
        with self._lock:
            self._closed = True  # from here on only the thread sends (what was queued before the end)
        self._queue.put(None)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._socket.close()

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            self._socket.send(data)  # `_queued` > 0 until the decrement: no caller uses the socket meanwhile
            with self._lock:
                self._queued -= 1


class SchedulerProcess:
    def __init__(self, args: ServerArgs, log_dir: Path, inbound: str, outbound: str) -> None:
        self.ctx = zmq.Context()
        self.inbound = self.ctx.socket(zmq.PULL)
        self.inbound.connect(inbound)
        self.sender = Sender(self.ctx, outbound)
        self.runtime: Runtime = build_runtime(args, log_dir, self._on_durable, beside_front=True)
        self.sched = self.runtime.scheduler
        self.shutdown_deadline: float | None = None
        self.failure: BaseException | None = None
        self._last_stats = 0.0
        self._last_head = time.monotonic()
        # The front is our parent; when it dies (kill -9) we are re-parented and getppid() changes.
        self._parent_pid = os.getppid()
        self.orphaned = False
        self._stop_reason = "server shutdown"  # logged with each request the end of the grace aborts
        # The scheduler's state: held by `serve`'s loop, released for each forward and each idle wait.
        self.lock = threading.Lock()
        self._arrivals: deque[Message] = deque()  # received, not yet handled (in order)
        self._arrived = threading.Event()  # set by the receiver when it queued a message
        self._stop_receiving = threading.Event()
        self.receiver_failure: BaseException | None = None  # raised by the loop: the process stops loudly

    def _on_durable(self, deltas: list[RequestDelta], error: BaseException | None) -> None:
        if error is not None:  # nothing more may be shown: stop loudly, the front answers 503
            self.failure = error
            return
        if deltas:
            self.sender.send(DeltasMsg(deltas, time.time()))

    def announce(self) -> None:
        rt = self.runtime
        self.sender.send(ReadyMsg(str(rt.model_dir), str(rt.log_dir), rt.limits.vocab_size, rt.limits.context_len,
                                  rt.limits.kv_capacity, self.sched.ledger.instance_id))

    def serve(self) -> None:
        receiver = threading.Thread(target=self._receive_loop, name="tokenledger-receiver", daemon=True)
        with self.lock:
            if self.sched.kv_pool.device.type == "cpu":
                # A CUDA launch only enqueues work and returns: nothing to serve aborts beside, and
                # results read back by another thread would sync the device under the lock.
                self.sched.forward_gate = self._unlocked
            receiver.start()
            try:
                self._loop()
            finally:
                self._stop_receiving.set()
                with self._unlocked():
                    receiver.join()
                self.sched.forward_gate = nullcontext
        self.sched.ledger.close()  # SERVER_STOP
        self.publish_head(final=True)
        if self.orphaned:
            self.sender.close(timeout=ORPHAN_SEND_TIMEOUT_S)
            return
        self._maybe_send_stats(force=True)
        self.sender.send(StoppedMsg())
        self.sender.close()

    def _loop(self) -> None:
        while not self._should_stop():
            self._check_parent()
            if self.failure is not None:
                raise RuntimeError(f"the log writer failed: {self.failure}") from self.failure
            if self.receiver_failure is not None:
                raise RuntimeError(f"handling a message failed: {self.receiver_failure}") from self.receiver_failure
            was_busy = not self.sched.is_idle
            if not was_busy:
                self._idle_wait()
            self._handle_arrived()
            self.sched.settle_aborts(wait=True)  # durable before the next forward starts
            if not self.sched.is_idle:
                self.sched.run_step()
                if self.sched.is_idle and self.shutdown_deadline is None:
                    # Once per drain, not at every idle poll: with a full prefix cache the check walks
                    # the whole tree, which took 11 % of this process's CPU at 20 polls a second.
                    self.sched.check_integrity()
            # Report at once when the scheduler goes idle, so gauges read 0 after a drain.
            self._maybe_send_stats(force=was_busy and self.sched.is_idle)
            self._maybe_publish_head()

    @contextmanager
    def _unlocked(self) -> Iterator[None]:
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()

    def _idle_wait(self) -> None:
        """Nothing to run: wait (unlocked) until a message arrived, or a poll interval. The queue is
        drained under the lock afterwards, so a wake-up cleared here is never lost."""
        with self._unlocked():
            self._arrived.wait(IDLE_POLL_MS / 1000)
            self._arrived.clear()

    @property
    def _serves_mid_forward(self) -> bool:
        """The receiver handles messages itself: forwards run unlocked (CPU, while serving)."""
        return self.sched.forward_gate is not nullcontext

    def _handle_arrived(self) -> None:
        """Handles every queued message in arrival order (the lock held; the receiver only appends).
        Aborts are only staged here: the caller then settles the burst (`Scheduler.settle_aborts`),
        so each burst's records are one group and one fsync."""
        while self._arrivals:
            self._handle(self._arrivals.popleft())

    def _receive_loop(self) -> None:
        """The receiver thread, the inbound socket's only user. It queues what arrives and wakes an
        idle loop. Where forwards run unlocked (CPU), it then handles the queue itself if it can
        take the lock within a few ms: it can while the loop's forward runs (the forward reads only
        its own batch) or while it idles. Otherwise the loop handles the queue at its next turn, as
        it did before this thread, so nothing waits on the lock. Any failure here stops the loop."""
        try:
            while not self._stop_receiving.is_set():
                try_lock = self._serves_mid_forward and bool(self._arrivals)
                if self.inbound.poll(0 if try_lock else IDLE_POLL_MS):
                    while self.inbound.poll(0):
                        self._arrivals.append(decode(self.inbound.recv()))
                    self._arrived.set()
                if not (self._serves_mid_forward and self._arrivals and self.lock.acquire(timeout=LOCK_TRY_S)):
                    continue
                try:
                    self._handle_arrived()
                    self.sched.settle_aborts()  # one group for the burst; the forward, if one runs, goes on
                finally:
                    self.lock.release()
        except BaseException as exc:  # noqa: BLE001 - as when the loop handles a message: fatal
            self.receiver_failure = exc
            self._arrived.set()

    def _check_parent(self) -> None:
        """A front killed without a word (kill -9, OOM) would leave this process holding the log's writer
        lock, and a restart would be refused (issue 10 E.18). One getppid() a loop turn is cheap."""
        if self.orphaned or os.getppid() == self._parent_pid:
            return
        self.orphaned = True
        log.warning("front_gone", parent_pid=self._parent_pid, live_requests=len(self.sched.reqs),
                    action="aborting live requests (logged), writing SERVER_STOP, exiting")
        self._stop_reason = "server shutdown: the front process is gone"
        self.shutdown_deadline = time.monotonic()  # no grace: nobody is left to receive the tokens

    def _maybe_publish_head(self) -> None:
        now = time.monotonic()
        if now - self._last_head >= CHAIN_HEAD_INTERVAL_S:
            self._last_head = now
            self.publish_head(final=False)

    def publish_head(self, final: bool) -> ChainHead:
        """Log the head of the last DURABLE record (never one a crash could still take back), so that
        a log pipeline holds it outside the log directory; `final` marks the SERVER_STOP head."""
        head = self.sched.ledger.head()
        log.info("chain_head", lsn=head.lsn, hash=head.chain_hash.hex(), expect_head=head.text, final=final,
                 instance=self.sched.ledger.instance_id, log_dir=str(self.runtime.log_dir))
        return head

    def _should_stop(self) -> bool:
        if self.shutdown_deadline is None:
            return False
        if time.monotonic() >= self.shutdown_deadline and self.sched.reqs:
            for rid in list(self.sched.reqs):  # grace is over: abort the rest, logged
                self.sched.abort(rid, DoomSource.SHUTDOWN, lambda _a, _e: None, self._stop_reason)
        return self.sched.is_idle

    def _handle(self, msg: Message) -> None:
        if isinstance(msg, GenerateMsg):
            self._admit(msg)
        elif isinstance(msg, AbortMsg):
            self._abort(msg)
        elif isinstance(msg, ShutdownMsg):
            self.shutdown_deadline = time.monotonic() + msg.grace_s
        elif isinstance(msg, FlushCacheMsg):
            self.sender.send(FlushCacheReplyMsg(msg.ticket, self.sched.flush_cache(), len(self.sched.reqs)))

    def _admit(self, msg: GenerateMsg) -> None:
        if self.shutdown_deadline is not None:
            self.sender.send(RejectMsg(msg.rid, "the server is shutting down", 503))
        elif msg.rid in self.sched.reqs:
            self.sender.send(RejectMsg(msg.rid, f"rid {msg.rid!r} is already in use by a live request", 409))
        else:
            self._add(msg)

    def _add(self, msg: GenerateMsg) -> None:
        """One message the scheduler cannot admit fails that request only; the loop goes on.
        (Log-writer failures arrive through `_on_durable` and stay fatal.)"""
        try:
            self.sched.add_request(Req.from_spec(msg.to_spec()))
        except RequestRefusedError as exc:
            self.sender.send(RejectMsg(msg.rid, str(exc), 400))
        except Exception as exc:  # noqa: BLE001 - refused before BEGIN: nothing logged, nothing held
            self.sender.send(RejectMsg(msg.rid, f"the scheduler could not admit the request: "
                                                f"{type(exc).__name__}: {exc}", 500))

    def _abort(self, msg: AbortMsg) -> None:
        rids = list(self.sched.reqs) if msg.abort_all else msg.rids
        answers: list[AbortAnswer] = []
        source = DoomSource(msg.source)

        def collect(answer: AbortAnswer, _error: BaseException | None) -> None:
            answers.append(answer)
            if len(answers) == len(rids):
                self.sender.send(AbortReplyMsg(msg.ticket, answers))

        if not rids:
            self.sender.send(AbortReplyMsg(msg.ticket, []))
        for rid in rids:
            self.sched.abort(rid, source, collect, flush=False)  # answered by the burst's settle_aborts

    def _maybe_send_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_stats < STATS_INTERVAL_S:
            return
        self._last_stats = now
        sched, counters = self.sched, self.sched.counters
        steps, wal = counters.drain_samples()
        self.sender.send(StatsMsg(
            running=len(sched.running), waiting=len(sched.waiting), kv_used=sched.kv_live_tokens,
            kv_total=sched.kv_pool.capacity, kv_cached=sched.kv_cached_tokens,
            prefix_query_tokens=counters.prefix_query_tokens, prefix_hit_tokens=counters.prefix_hit_tokens, durable_lsn=sched.ledger.writer.durable_lsn, step_seconds=steps,
            wal_commit_seconds=wal, aborts=dict(counters.aborts), discarded=counters.discarded_results,
            generated=counters.generated_tokens,
        ))


def scheduler_main(args: ServerArgs, log_dir: str, inbound: str, outbound: str) -> None:
    """Entry point of the spawned process. SIGTERM/SIGINT belong to the front's shutdown."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(args.log_format)
    try:
        proc = SchedulerProcess(args, Path(log_dir), inbound, outbound)
    except TokenLedgerError as exc:
        _report_fatal(outbound, str(exc))
        raise SystemExit(2) from None
    except Exception as exc:  # noqa: BLE001 - reported to the front, then the process exits
        _report_fatal(outbound, f"{type(exc).__name__}: {exc}")
        raise SystemExit(2) from None
    freeze_startup_heap()
    proc.announce()
    try:
        proc.serve()
    except Exception as exc:  # noqa: BLE001 - the front turns this into 503s and a non-zero exit
        proc.sender.send(FatalMsg(f"{type(exc).__name__}: {exc}"))
        proc.sender.close()
        raise SystemExit(1) from None


def _report_fatal(outbound: str, message: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(outbound)
    sock.send(encode(FatalMsg(message)))
    sock.close()
    ctx.term()
