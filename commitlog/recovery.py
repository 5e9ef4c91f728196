"""Recovery on open for writing: check the tail, then close out requests a crash left open (I7)."""
from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from pathlib import Path

import lmdb

from commitlog.codec import Encoder, Entry, Kind, Record, key_lsn, stray_key_message
from commitlog.errors import CorruptRecordError
from commitlog.isolate import run_isolated
from commitlog.reader import LogReader
from commitlog.state import FinishReason, finish_entry, replay
from commitlog.wal import DATA_FILE, META_INSTANCE_PREFIX, Wal

TAIL_CHECK_RECORDS = 256


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    last_lsn: int
    was_clean: bool
    interrupted: list[str]
    stale_readers_cleared: int


def recover(wal: Wal) -> tuple[Encoder, list[Entry], RecoveryReport]:
    """Return the encoder to continue the log with and the entries recovery must append.

    A corrupt tail refuses the open: the error names the LSN and the salvage command.
    """
    try:
        cleared = wal.env.reader_check()
        return _plan(LogReader(wal), cleared)
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.detail, exc.lsn, str(wal.log_dir)) from None
    except lmdb.Error as exc:  # MDB_CORRUPTED and the like: a damaged page, not a bug
        raise CorruptRecordError(f"the LMDB file is damaged ({exc})", None, str(wal.log_dir)) from None


def preflight(log_dir: str | os.PathLike[str]) -> None:
    """Recovery's reads and the open's first write (aborted, never committed), first in a forked child
    (`commitlog.isolate`): a damaged page that would kill the process (SIGBUS, SIGSEGV) refuses the
    open with the salvage command instead of killing the server.

    Only a crash is reported from here; any other outcome is met again, as the precise typed error, by
    the same reads and write in this process, which then cannot crash (the bytes are the same). A
    daemonic process may not have children (multiprocessing): there, they run in this process alone."""
    if multiprocessing.current_process().daemon:
        return
    (outcome,) = run_isolated([(_recovery_trial, (str(log_dir),))])
    if outcome.status == "crashed":
        raise CorruptRecordError(outcome.message, None, str(log_dir))


def _recovery_trial(log_dir: str) -> None:
    """What `Ledger.open` does to an existing log, up to its first write, which is applied and aborted:
    the reads alone need not touch the pages a write does (the free list's, a table's right edge)."""
    if not (Path(log_dir) / DATA_FILE).exists():
        return  # a new log: nothing to read
    wal = Wal.open(log_dir)
    try:
        encoder, entries, _report = recover(wal)
        # As `Ledger._start` writes it: recovery's entries, then SERVER_START and an instance's meta key.
        group = encoder.encode([*entries, Entry(Kind.SERVER_START, None, {"instance": "preflight"})])
        group.meta.append((META_INSTANCE_PREFIX + b"preflight", b"0"))
        wal.trial_write([group])
    finally:
        wal.close()


def _plan(reader: LogReader, cleared: int) -> tuple[Encoder, list[Entry], RecoveryReport]:
    _refuse_stray_keys(reader)
    _refuse_unreadable_index(reader)
    last_lsn, last_hash, tail = reader.verify_tail(TAIL_CHECK_RECORDS)
    _refuse_unlisted_running(reader, tail)
    entries, lsns, report = _close_interrupted(reader, last_lsn, cleared)
    return Encoder(last_lsn + 1, last_hash, lsns), entries, report


def _refuse_stray_keys(reader: LogReader) -> None:
    """A key that is not an 8-byte LSN would be taken for a far-away LSN (issue 10 C.13), and a
    missing LSN is a removed record: refuse both.

    LMDB's entry count is free; only when it disagrees with what the LSNs and the checkpoint
    account for is every key read (keys only), to name the stray or missing ones."""
    last = reader.last_lsn()
    cp = reader.checkpoint()
    cut = 1 if cp is None else int(cp.payload["start"])
    kept = set() if cp is None else {int(lsn) for lsn, _prev in cp.payload["kept"]}
    expected = len(kept) + max(0, last - cut + 1)
    if reader.num_keys() == expected:
        return
    keys = reader.record_keys()
    stray = [key for key in keys if len(key) != 8]
    if stray:
        more = f" (and {len(stray) - 1} more such key(s))" if len(stray) > 1 else ""
        raise CorruptRecordError(stray_key_message(stray[0]) + more)
    present = {key_lsn(key) for key in keys}
    unlisted = sorted(lsn for lsn in present if lsn < cut and lsn not in kept)
    if unlisted:
        raise CorruptRecordError("record precedes the checkpoint's start and is not listed in it (inserted)",
                                 unlisted[0])
    missing = next((lsn for lsn in [*sorted(kept), *range(cut, last + 1)] if lsn not in present), None)
    if missing is not None:
        raise CorruptRecordError(f"missing from the records table (removed): {len(present)} records, the LSNs "
                                 f"and the checkpoint account for {expected}", missing)


def _refuse_unreadable_index(reader: LogReader) -> None:
    """The per-request index is outside the hash chain and not proven here (that costs a full scan), but
    a page LMDB cannot read at its root or edges would stop the server at its first request's write, and
    every reader refuses such a log: refuse the open now, naming salvage, which rebuilds the index."""
    try:
        reader.touch_index_edges()
    except lmdb.Error as exc:
        raise CorruptRecordError(f"the per-request index (by_rid) is unreadable ({exc})") from None


def _refuse_unlisted_running(reader: LogReader, tail: list[Record]) -> None:
    """A request begun in the checked tail and not finished there must be in `live` at its BEGIN, or the
    restart would never finish it as interrupted (I7) and `verify` would report it for good. A BEGIN
    before the tail is not looked for: that would cost a scan of the whole log."""
    running: dict[str, int] = {}
    for record in tail:
        if record.rid is not None and record.kind is Kind.BEGIN:
            running[record.rid] = record.lsn
        elif record.rid is not None and record.kind is Kind.FINISH:
            running.pop(record.rid, None)
    for rid, begin in sorted(running.items(), key=lambda item: item[1]):
        if reader.live_begin(rid) != begin:
            raise CorruptRecordError(f"{rid!r} began here and has no FINISH, but the live table does not name "
                                     "this BEGIN (live table rewritten or damaged)", begin)


def _running(reader: LogReader, rid: str) -> list[Record]:
    """The records of a request `live` names, proven by the records: the live table is outside the
    hash chain (issue 10 C.12), and finishing a request that is not there would log a lie."""
    records = reader.running_records(rid)  # this incarnation only: earlier ones are indexed already
    if not records or records[0].kind is not Kind.BEGIN:
        raise CorruptRecordError(f"the live table names {rid!r} as running, but no BEGIN of it is at the LSN "
                                 "it gives (live table rewritten or damaged)")
    if records[-1].kind is Kind.FINISH:
        raise CorruptRecordError(f"the live table names {rid!r} as running, but it finished at LSN "
                                 f"{records[-1].lsn} (live table rewritten or damaged)", records[-1].lsn)
    return records


def _close_interrupted(reader: LogReader, last_lsn: int,
                       cleared: int) -> tuple[list[Entry], dict[str, list[int]], RecoveryReport]:
    last = next(iter(reader.records(last_lsn)), None) if last_lsn else None
    was_clean = last is None or last.kind is Kind.SERVER_STOP
    interrupted = reader.live_request_ids()
    entries: list[Entry] = []
    lsns: dict[str, list[int]] = {}
    for rid in interrupted:
        records = _running(reader, rid)
        state = replay(records)
        assert state is not None  # _running proved its BEGIN
        state.finish_reason = FinishReason.INTERRUPTED
        entries.append(finish_entry(state))
        lsns[rid] = [r.lsn for r in records]
    if not was_clean:
        entries.append(Entry(Kind.RECOVERED, None, {"interrupted": interrupted, "last_lsn": last_lsn}))
    return entries, lsns, RecoveryReport(last_lsn, was_clean, interrupted, cleared)

