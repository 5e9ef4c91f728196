"""The writer thread: owns every LMDB write transaction and reports when groups are durable.

Callers encode records themselves (codec.Encoder) so this thread spends its time inside
LMDB's commit and fsync, which release the GIL; a busy scheduler thread is not slowed.
Group commit across steps: the groups that queued up while the writer was busy (in an
fsync) go into its next write txn together, so one fsync makes them all durable and the
writer never falls a queue of fsyncs behind the scheduler.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from commitlog.codec import GENESIS_HASH, EncodedGroup
from commitlog.errors import WriterFailedError
from commitlog.wal import Durability, Wal, WalConfig

DurableCallback = Callable[[int, "BaseException | None"], None]


def _log() -> Any:
    """structlog is imported only when something goes wrong: it is off the hot path and slow to import."""
    import structlog
    return structlog.get_logger("commitlog.writer")


@dataclass(slots=True)
class _Item:
    group: EncodedGroup | None = None
    callback: DurableCallback | None = None
    job: Callable[[Wal], Any] | None = None
    future: Future[Any] | None = None


@dataclass(slots=True)
class WriterStats:
    """Where the log's time goes (bench throughput --paired reads them). Each field has one writing
    thread: the txn figures the writer's, `back_pressure_seconds` the submitter's."""

    num_txns: int = 0
    num_groups: int = 0
    write_seconds: float = 0.0  # in LMDB write txns, commit (and its fsync) included
    max_write_seconds: float = 0.0
    back_pressure_seconds: float = 0.0  # `submit` blocked on a full queue


_STOP = _Item()
_NO_WAITER = 1 << 63


class WalWriter:
    """Single writer thread. `submit` never waits on disk (only on a full queue)."""

    def __init__(self, wal: Wal, config: WalConfig, durable_lsn: int = 0, durable_hash: bytes = GENESIS_HASH) -> None:
        self.wal = wal
        self.durability = config.durability
        self._interval_s = config.sync_interval_ms / 1000
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()  # C-level: cheap hand-off
        self._max_pending = config.max_pending_groups
        self._pending_lsns: deque[int] = deque()  # last LSN of each submitted group not yet seen durable
        self._durable_lsn = durable_lsn
        # (LSN, chain hash) of the last durable record, replaced as one tuple so any thread reads a matching pair.
        self._durable_head = (durable_lsn, durable_hash)
        self._cond = threading.Condition()
        self._wanted_lsn = _NO_WAITER  # lowest LSN a wait_durable caller is blocked on
        self._error: WriterFailedError | None = None
        self._unsynced: list[tuple[int, bytes, DurableCallback | None]] = []
        self._last_sync = time.monotonic()
        self.stats = WriterStats()
        self._thread = threading.Thread(target=self._run, name="commitlog-writer", daemon=True)
        self._thread.start()

    @property
    def durable_lsn(self) -> int:
        """Highest LSN whose group is durable under the configured durability mode."""
        return self._durable_lsn

    @property
    def durable_head(self) -> tuple[int, bytes]:
        """(LSN, stored chain hash) of the highest durable record: what `verify --expect-head` takes."""
        return self._durable_head

    @property
    def error(self) -> WriterFailedError | None:
        return self._error

    def submit(self, group: EncodedGroup, on_durable: DurableCallback | None = None) -> None:
        """Queue one group; `on_durable(last_lsn, error)` runs on the writer thread.

        Call from one thread (the scheduler's); blocks only when `max_pending_groups` are queued.
        """
        self._raise_if_failed()
        self._apply_back_pressure()
        self._pending_lsns.append(group.last_lsn)
        self._queue.put(_Item(group=group, callback=on_durable))

    def _apply_back_pressure(self) -> None:
        """With `max_pending_groups` queued, wait until half are durable: one wake-up per half queue."""
        pending = self._pending_lsns
        while pending and pending[0] <= self._durable_lsn:
            pending.popleft()
        if len(pending) >= self._max_pending:
            started = time.perf_counter()
            self.wait_durable(pending[len(pending) // 2])
            self.stats.back_pressure_seconds += time.perf_counter() - started

    def call(self, job: Callable[[Wal], Any]) -> Future[Any]:
        """Run `job(wal)` on the writer thread, between groups (in-process reads, retention)."""
        self._raise_if_failed()
        future: Future[Any] = Future()
        self._queue.put(_Item(job=job, future=future))
        return future

    def wait_durable(self, lsn: int, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._durable_lsn < lsn and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._wanted_lsn = min(self._wanted_lsn, lsn)
                self._cond.wait(remaining)
            done = self._durable_lsn >= lsn
        self._raise_if_failed()
        return done

    def close(self) -> None:
        """Drain the queue, sync what is pending, stop the thread. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        held: _Item | None = None  # taken off the queue behind a batch of groups; runs next, in order
        while True:
            if held is not None:
                item, held = held, None
            else:
                try:
                    item = self._queue.get(timeout=self._time_to_sync())
                except queue.Empty:
                    self._guarded([], self._sync_unsynced)
                    continue
            if item is _STOP:
                break
            if item.group is not None and self._error is None:
                batch, held = self._queued_groups(item)
                self._guarded([i.callback for i in batch], self._write, batch)
            else:
                self._handle(item)
        if self._error is None:
            self._guarded([], self._sync_unsynced)

    def _queued_groups(self, first: _Item) -> tuple[list[_Item], _Item | None]:
        """`first` and the groups queued behind it (at most `max_pending_groups`), up to the first
        item that is not a group (a job, the stop), which is returned to run after them."""
        batch = [first]
        while len(batch) < self._max_pending:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, None
            if item.group is None:
                return batch, item
            batch.append(item)
        return batch, None

    def _handle(self, item: _Item) -> None:
        if self._error is not None:
            self._reject(item, self._error)
        elif item.job is not None and item.future is not None:
            try:
                item.future.set_result(item.job(self.wal))
            except BaseException as exc:  # the job's own failure belongs to its caller
                item.future.set_exception(exc)

    def _guarded(self, callbacks: list[DurableCallback | None], fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # any write error is fatal: never retried, never swallowed
            self._fail(exc, callbacks)

    def _write(self, batch: list[_Item]) -> None:
        groups = [item.group for item in batch if item.group is not None]
        started = time.perf_counter()
        self.wal.write_groups(groups)  # one txn: under fsync, one sync makes every group in it durable
        self._count(len(groups), time.perf_counter() - started)
        if self.durability is Durability.PERIODIC:
            self._unsynced.extend((item.group.last_lsn, item.group.last_hash, item.callback)
                                  for item in batch if item.group is not None)
            if self._time_to_sync() == 0:
                self._sync_unsynced()
        else:
            self._publish(groups[-1].last_lsn, groups[-1].last_hash,
                          [(group.last_lsn, item.callback) for group, item in zip(groups, batch)])

    def _count(self, num_groups: int, seconds: float) -> None:
        stats = self.stats
        stats.num_txns += 1
        stats.num_groups += num_groups
        stats.write_seconds += seconds
        stats.max_write_seconds = max(stats.max_write_seconds, seconds)

    def _time_to_sync(self) -> float | None:
        if not self._unsynced:
            return None
        return max(0.0, self._last_sync + self._interval_s - time.monotonic())

    def _sync_unsynced(self) -> None:
        self._last_sync = time.monotonic()
        if not self._unsynced:
            return
        self.wal.sync()
        pending, self._unsynced = self._unsynced, []
        self._publish(pending[-1][0], pending[-1][1], [(pending[-1][0], cb) for _, _, cb in pending])

    def _publish(self, lsn: int, chain_hash: bytes, callbacks: list[tuple[int, DurableCallback | None]]) -> None:
        """`lsn` is durable now; each callback gets the LSN it waited for (its group's last, or the sync's)."""
        with self._cond:
            self._durable_lsn = lsn
            self._durable_head = (lsn, chain_hash)
            if lsn >= self._wanted_lsn:  # wake waiters only when one of them is satisfied
                self._wanted_lsn = _NO_WAITER
                self._cond.notify_all()
        for callback_lsn, callback in callbacks:
            if callback is not None:
                self._run_callback(callback, callback_lsn, None)

    def _run_callback(self, callback: DurableCallback, lsn: int, error: BaseException | None) -> None:
        try:
            callback(lsn, error)
        except Exception:
            _log().exception("durable_callback_failed", lsn=lsn)

    def _fail(self, exc: BaseException, callbacks: list[DurableCallback | None]) -> None:
        error = WriterFailedError(
            f"log writer for {self.wal.log_dir} failed: {type(exc).__name__}: {exc}. Nothing after "
            f"LSN {self._durable_lsn} is durable; stop the server, check the disk, then restart "
            "(recovery marks unfinished requests interrupted)")
        error.__cause__ = exc
        _log().error("wal_writer_failed", log_dir=str(self.wal.log_dir), error=repr(exc),
                   durable_lsn=self._durable_lsn)
        with self._cond:
            self._error = error
            self._cond.notify_all()
        # A periodic sync that fails inside a write has that write's callbacks in `_unsynced` too: once each.
        waiting = [pending for _, _, pending in self._unsynced]
        waiting += [cb for cb in callbacks if not any(cb is other for other in waiting)]
        self._unsynced = []
        for callback in waiting:
            if callback is not None:
                self._run_callback(callback, self._durable_lsn, error)

    def _reject(self, item: _Item, error: WriterFailedError) -> None:
        if item.callback is not None:
            self._run_callback(item.callback, self._durable_lsn, error)
        if item.future is not None:
            item.future.set_exception(error)
