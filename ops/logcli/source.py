"""The log as `replay`, `audit` and `export` read it: every LMDB read in a forked child (issue 10
D.16), so a damaged page that kills LMDB (SIGBUS, SIGSEGV, SIGABRT) or makes it raise MDB_CORRUPTED
ends the command with exit 2, a message and the salvage command, never a crash. Records come back
in chunks, so export still streams; what was printed before the damage is marked incomplete.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from commitlog import CommitLogError, CorruptRecordError, LogReader, Record
from commitlog.codec import decode_value, lsn_key
from commitlog.isolate import Outcome, run_isolated
from ops.logcli.readcheck import ReadCheck

CHUNK = 16384  # records per child: a fork and a pipe per chunk


def _call(log_dir: str, name: str, *args: Any) -> Any:
    """In the child: open, read, close; an LMDB error on damaged pages becomes CorruptRecordError."""
    reader = LogReader.open(log_dir)
    try:
        return _READS[name](reader, *args)
    except lmdb.Error as exc:
        raise CorruptRecordError(f"the LMDB file is damaged ({exc})") from None
    finally:
        reader.close()


def _chunk(reader: LogReader, resume: bytes, end: int | None) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
    """Raw pairs: bytes cross the pipe ~10x faster than Records; decoding (no LMDB) is safe here."""
    return reader.raw_chunk(resume, end, CHUNK)


_READS: dict[str, Callable[..., Any]] = {
    "chunk": _chunk,
    "request_records": LogReader.request_records,
    "last_lsn": LogReader.last_lsn,
    "chain_walker": LogReader.chain_walker,
    "meta": lambda reader, key: reader.wal.get_meta(key),
}


class IsolatedLog:
    """The reads the post-mortem commands need, each run in a forked child. Never opens LMDB here."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self._after = 0  # the last LSN handed out: where a failure is reported

    def _run(self, name: str, *args: Any) -> Any:
        (outcome,) = run_isolated([(_call, (self.log_dir, name, *args))])
        if outcome.ok:
            return outcome.value
        raise self._error(outcome)

    def _error(self, outcome: Outcome) -> CommitLogError:
        where = f" after LSN {self._after}" if self._after else ""
        if outcome.status == "corrupt":
            return CorruptRecordError(outcome.message + where, outcome.lsn or (self._after + 1 if self._after else None))
        if outcome.status == "crashed":
            return CorruptRecordError(outcome.message + where, self._after + 1 if self._after else None)
        return CommitLogError(outcome.message)

    def records(self, start: int = 1, end: int | None = None) -> Iterator[Record]:
        """From LSN 1, each record is proven (chain, contiguity) before it is handed out, and a walk to
        the end checks the index and live tables too (`ops.logcli.readcheck`): what `verify` rejects,
        the readers refuse."""
        check = ReadCheck(self._run("chain_walker")) if start <= 1 else None
        resume: bytes | None = lsn_key(start) if start > 1 else b""
        while resume is not None:
            pairs, resume = self._run("chunk", resume, end)
            for key, value in pairs:
                record = decode_value(key, value)
                if check is not None:
                    check.feed(record)
                yield record
                self._after = record.lsn
        if check is not None:
            check.finish(self.log_dir, end is None, self._error)

    def request_records(self, rid: str) -> list[Record]:
        records: list[Record] = self._run("request_records", rid)
        return records

    def last_lsn(self) -> int:
        return int(self._run("last_lsn"))

    def get_meta(self, key: bytes) -> bytes | None:
        value: bytes | None = self._run("meta", key)
        return value
