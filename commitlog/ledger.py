"""The scheduler's one entry point to the commit log: live requests, steps, group flushes.

Not thread-safe: one scheduler thread calls it; the writer thread only sees encoded groups.
"""
from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from commitlog.codec import Encoder, Entry, Kind
from commitlog.errors import RequestRefusedError, TxnStateError, UnknownRequestError, WriterFailedError
from commitlog.head import ChainHead
from commitlog.reader import LogReader
from commitlog.recovery import RecoveryReport, preflight, recover
from commitlog.rids import rid_problem
from commitlog.schedule import engine_settings, forward_entry
from commitlog.state import (
    DoomSource,
    FinishReason,
    RequestState,
    begin_entry,
    finish_entry,
)
from commitlog.txn import GrammarMatcher, Outcome, RequestTxn, TokenCounter
from commitlog.wal import META_FINGERPRINT, META_INSTANCE_PREFIX, META_TOKENIZER_DIR, Wal, WalConfig
from commitlog.writer import DurableCallback, WalWriter

T = TypeVar("T")


class Ledger:
    """Owns the live request states and the log they are written ahead to."""

    def __init__(self, wal: Wal, writer: WalWriter, encoder: Encoder, recovery: RecoveryReport) -> None:
        self.wal = wal
        self.writer = writer
        self.recovery = recovery
        self.instance_id = ""
        self._encoder = encoder
        self._live: dict[str, RequestState] = {}
        self._pending: list[Entry] = []
        self._deletes: list[tuple[bytes, bytes | None]] = []
        self._num_forwards = 0

    @classmethod
    def open(cls, log_dir: str | os.PathLike[str], config: WalConfig | None = None,
             model_fingerprint: str = "", tokenizer_dir: str = "", engine: Mapping[str, Any] | None = None) -> Ledger:
        """Open for writing: recover (may raise CorruptRecordError), then log SERVER_START.

        `tokenizer_dir` is recorded so that post-mortem tools can decode text without being told;
        `engine`, the settings that change numerics (`commitlog.schedule.ENGINE_KEYS`), so that
        `replay --reexecute` can rebuild the same engine.
        """
        cfg = config or WalConfig()
        preflight(log_dir)
        wal = Wal.open(log_dir, cfg)
        try:
            encoder, entries, report = recover(wal)
        except BaseException:
            wal.close()
            raise
        writer = WalWriter(wal, cfg, durable_lsn=encoder.next_lsn - 1, durable_hash=encoder.prev_hash)
        ledger = cls(wal, writer, encoder, report)
        try:
            ledger._start(entries, model_fingerprint, tokenizer_dir, None if engine is None else engine_settings(engine))
        except BaseException:  # the first write failed (WriterFailedError): hold neither the lock nor a thread
            with contextlib.suppress(WriterFailedError):
                writer.close()
            wal.close()
            raise
        return ledger

    def _start(self, recovery_entries: list[Entry], fingerprint: str, tokenizer_dir: str,
               engine: dict[str, Any] | None) -> None:
        self.instance_id = uuid.uuid4().hex
        start = {"instance": self.instance_id, "pid": os.getpid(), "fingerprint": fingerprint,
                 "tokenizer_dir": tokenizer_dir}
        if engine is not None:  # only a server that logs its schedule records its engine (FORMAT.md)
            start["engine"] = engine
        self._pending = recovery_entries + [Entry(Kind.SERVER_START, None, start)]
        start_lsn = self._encoder.next_lsn + len(recovery_entries)
        meta = [(META_INSTANCE_PREFIX + self.instance_id.encode(), str(start_lsn).encode()),
                (META_FINGERPRINT, fingerprint.encode()), (META_TOKENIZER_DIR, tokenizer_dir.encode())]
        self.writer.wait_durable(self._flush(None, meta))

    def head(self) -> ChainHead:
        """The chain head of the last durable record (after `close`: the final SERVER_STOP's); a log
        pipeline keeps these so `verify --expect-head` can later prove nothing before them was edited."""
        lsn, chain_hash = self.writer.durable_head
        return ChainHead(lsn, chain_hash)

    @property
    def live(self) -> Mapping[str, RequestState]:
        return self._live

    def get(self, rid: str) -> RequestState:
        try:
            return self._live[rid]
        except KeyError:
            raise UnknownRequestError(f"request {rid!r} is not running (never begun, or finished)") from None

    def begin(self, rid: str, prompt_ids: list[int], sampling_params: Mapping[str, Any],
              grammar_spec: str | None = None, arrival_ns: int | None = None) -> RequestState:
        if (problem := rid_problem(rid)) is not None:
            raise RequestRefusedError(problem)
        if rid in self._live:
            raise RequestRefusedError(f"request {rid!r} is already running")
        state = RequestState(rid, [int(t) for t in prompt_ids], dict(sampling_params), grammar_spec,
                             time.time_ns() if arrival_ns is None else arrival_ns)
        self._live[rid] = state
        self._pending.append(begin_entry(state))
        return state

    def doom(self, rid: str, reason: str, source: DoomSource) -> bool:
        """Mark a running request aborted: every later transaction of it rolls back (I2).

        Returns False when no such request is running, so an abort API can say so honestly.
        """
        state = self._live.get(rid)
        if state is None or state.is_finished:
            return False
        if not state.is_doomed:
            state.doom_reason, state.doom_source, state.abort_time_ns = reason, source, time.time_ns()
            self._pending.append(Entry(Kind.ABORT_REQUESTED, rid, {
                "reason": reason, "source": source.value, "t": state.abort_time_ns}))
        return True

    def finish(self, rid: str, reason: FinishReason, matched: int | str | None = None) -> None:
        """Finish a request outside a transaction (an aborted waiting request, a shutdown)."""
        state = self.get(rid)
        if state.is_finished:
            raise TxnStateError(f"request {rid!r} already finished ({state.finish_reason})")
        state.finish_reason, state.finish_matched = reason, matched
        self._pending.append(finish_entry(state))

    def log_forward(self, mode: str, rids: list[str], prefixes: list[int], lengths: list[int], pending: int) -> int:
        """Stage the FORWARD record of a forward being launched (the schedule); returns its seq.

        Staged before that forward's results, so LSN order is launch order, and it joins the
        step's group: it costs no write of its own."""
        self._num_forwards += 1
        self._pending.append(forward_entry(self._num_forwards, mode, pending, rids, prefixes, lengths))
        return self._num_forwards

    def staged_lsn(self) -> int:
        """The LSN the most recently staged entry will be written at (e.g. an ABORT_REQUESTED)."""
        return self._encoder.next_lsn + len(self._pending) - 1

    def step(self) -> Step:
        return Step(self)

    def txn(self, rid: str, grammar: GrammarMatcher | None = None, counts: TokenCounter | None = None) -> RequestTxn:
        """A transaction for a running request; its record joins the next flushed group."""
        return RequestTxn(self.get(rid), self._pending, grammar, counts)

    def flush(self, on_durable: DurableCallback | None = None) -> int | None:
        """Write everything staged since the last flush as ONE group; None when nothing is staged."""
        if not self._pending:
            return None
        return self._flush(on_durable, [])

    def _flush(self, on_durable: DurableCallback | None, meta: list[tuple[bytes, bytes]]) -> int:
        group = self._encoder.encode(self._pending)
        group.meta.extend(meta)
        group.deletes, self._deletes = self._deletes, []
        for entry in self._pending:
            if entry.kind is Kind.FINISH and entry.rid is not None:
                self._live.pop(entry.rid, None)
        self._pending.clear()  # in place: open transactions hold this list
        self.writer.submit(group, on_durable)
        return group.last_lsn

    def stage_retention(self, checkpoint: Entry, deletes: list[tuple[bytes, bytes | None]]) -> None:
        """Used by retention: the next flush deletes `deletes` and appends `checkpoint`."""
        self._pending.append(checkpoint)
        self._deletes.extend(deletes)

    def read(self, query: Callable[[LogReader], T]) -> T:
        """Run a read on the writer thread (one process must not open the environment twice)."""
        result: T = self.writer.call(lambda wal: query(LogReader(wal))).result()
        return result

    def close(self) -> None:
        """Abort what is still running (source shutdown), log SERVER_STOP, drain, close."""
        for rid in list(self._live):
            if self.doom(rid, "server shutdown", DoomSource.SHUTDOWN):
                self.finish(rid, FinishReason.ABORT)
        self._pending.append(Entry(Kind.SERVER_STOP, None, {"instance": self.instance_id}))
        try:
            self.flush()
            self.writer.close()
        finally:
            self.wal.close()


class Step:
    """One batch result's transactions; `flush` writes them as one group (group commit)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._txns: list[RequestTxn] = []

    def open(self, rid: str, grammar: GrammarMatcher | None = None, counts: TokenCounter | None = None) -> RequestTxn:
        txn = self._ledger.txn(rid, grammar, counts)
        self._txns.append(txn)
        return txn

    def flush(self, on_durable: DurableCallback | None = None) -> int | None:
        still_open = [t.state.rid for t in self._txns if t.outcome is Outcome.OPEN]
        if still_open:
            raise TxnStateError(f"step flushed with open transactions for {still_open}; commit or roll back each")
        return self._ledger.flush(on_durable)
