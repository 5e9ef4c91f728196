"""Recovery on open for writing: check the tail, then close out requests a crash left open (I7)."""
from __future__ import annotations

from dataclasses import dataclass

from commitlog.codec import Encoder, Entry, Kind, stray_key_message
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


def _close_interrupted(reader: LogReader, last_lsn: int,
                       cleared: int) -> tuple[list[Entry], dict[str, list[int]], RecoveryReport]:
    last = next(iter(reader.records(last_lsn)), None) if last_lsn else None
    was_clean = last is None or last.kind is Kind.SERVER_STOP
    interrupted = reader.live_request_ids()
    entries: list[Entry] = []
    lsns: dict[str, list[int]] = {}
    for rid in interrupted:
        records = reader.running_records(rid)  # this incarnation only: earlier ones are indexed already
        state = replay(records)
        assert state is not None, f"live table names {rid!r} but its BEGIN is missing"
        state.finish_reason = FinishReason.INTERRUPTED
        entries.append(finish_entry(state))
        lsns[rid] = [r.lsn for r in records]
    if not was_clean:
        entries.append(Entry(Kind.RECOVERED, None, {"interrupted": interrupted, "last_lsn": last_lsn}))
    return entries, lsns, RecoveryReport(last_lsn, was_clean, interrupted, cleared)

