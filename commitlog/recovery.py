"""Recovery on open for writing: check the tail, then close out requests a crash left open (I7)."""
from __future__ import annotations

from dataclasses import dataclass

from commitlog.codec import Encoder, Entry, Kind, Record, stray_key_message
from commitlog.errors import CorruptRecordError
from commitlog.reader import LogReader
from commitlog.state import FinishReason, finish_entry, replay
from commitlog.wal import Wal

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
    cleared = wal.env.reader_check()
    reader = LogReader(wal)
    try:
        _refuse_stray_keys(reader)
        last_lsn, last_hash = reader.verify_tail(TAIL_CHECK_RECORDS)
        entries, lsns, report = _close_interrupted(reader, last_lsn, cleared)
    except CorruptRecordError as exc:
        raise CorruptRecordError(exc.detail, exc.lsn, str(wal.log_dir)) from None
    return Encoder(last_lsn + 1, last_hash, lsns), entries, report


def _refuse_stray_keys(reader: LogReader) -> None:
    """A key that is not an 8-byte LSN would be taken for a far-away LSN (issue 10 C.13): refuse it.

    LMDB's entry count is free; only when it disagrees with what the LSNs and the checkpoint
    account for is every key read (keys only), to name the stray ones."""
    last = reader.last_lsn()
    cp = reader.checkpoint()
    expected = last if cp is None else len(cp.payload["kept"]) + last - int(cp.payload["start"]) + 1
    if reader.num_keys() == expected:
        return
    stray = reader.stray_keys()
    if stray:
        more = f" (and {len(stray) - 1} more such key(s))" if len(stray) > 1 else ""
        raise CorruptRecordError(stray_key_message(stray[0]) + more)


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

