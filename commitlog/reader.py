"""Read-only access to a log: by LSN range, by request, following the tail, and verifying it.

Safe from any process while the server writes (LMDB readers never block the writer).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import lmdb
import msgpack

from commitlog.codec import (
    GENESIS_HASH,
    META_CHECKPOINT,
    Kind,
    Record,
    chain,
    decode_value,
    key_lsn,
    lsn_key,
    unpack_lsns,
)
from commitlog.errors import CorruptRecordError, UnknownRequestError
from commitlog.state import RequestState, replay
from commitlog.wal import Wal

_CHUNK = 1024  # records per read txn: long-lived read txns stop LMDB from reusing pages
_WINDOW_CHUNK = 16384  # undecoded pairs per read txn when walking one request's window


@dataclass(frozen=True, slots=True)
class VerifyReport:
    num_records: int
    first_lsn: int
    last_lsn: int
    checkpoint_lsn: int | None
    tail_hash: bytes


@dataclass(slots=True)
class ChainWalker:
    """Walks records in LSN order checking contiguity from `cut` and the hash chain; `LogReader.verify`
    and the post-mortem readers (`ops.logcli.source`) use it, so they refuse what `verify` rejects.
    Plain data: it crosses a pipe from the child that read the checkpoint."""

    cut: int
    prev_hash: bytes
    kept: dict[int, bytes]
    expected: int
    below: tuple[int, bytes] = (0, GENESIS_HASH)  # the last record below the cut: (LSN, stored hash)

    def check(self, record: Record) -> None:
        if record.lsn < self.cut:
            self._check_kept(record)
            return
        if record.lsn != self.expected:
            raise CorruptRecordError(f"LSN gap: expected {self.expected} (records removed)", record.lsn)
        if chain(self.prev_hash, record.body) != record.chain_hash:
            raise CorruptRecordError("hash chain broken (record edited, inserted or removed)", record.lsn)
        self.prev_hash, self.expected = record.chain_hash, record.lsn + 1

    def _check_kept(self, record: Record) -> None:
        """As `Scan._check_kept`: a listed predecessor hash must be the stored hash of LSN - 1 where that
        record exists, and the anchor the stored hash of `cut - 1` (issue 10 C.11)."""
        prev = self.kept.pop(record.lsn, None)
        if prev is None:
            raise CorruptRecordError("record precedes the checkpoint's start and is not listed in it", record.lsn)
        below_lsn, below_hash = self.below
        if below_lsn and below_lsn == record.lsn - 1 and prev != below_hash:
            raise CorruptRecordError(f"the checkpoint lists a predecessor hash that is not the stored hash of "
                                     f"LSN {below_lsn} (forged checkpoint)", record.lsn)
        if chain(prev, record.body) != record.chain_hash:
            raise CorruptRecordError("hash chain broken (record edited)", record.lsn)
        if record.lsn == self.cut - 1 and record.chain_hash != self.prev_hash:
            raise CorruptRecordError("the checkpoint's anchor is not this record's stored hash", record.lsn)
        self.below = (record.lsn, record.chain_hash)

    def finish(self) -> None:
        """After the last record: every record the checkpoint lists as kept must have been met."""
        if self.kept:
            raise CorruptRecordError("record listed in the checkpoint is missing", min(self.kept))


def _live_lsn(rid: str, value: bytes) -> int:
    if len(value) != 8:
        raise CorruptRecordError(f"the live table's entry for {rid!r} is {len(value)} bytes, not an 8-byte LSN "
                                 "(live table damaged)")
    return key_lsn(value)


def _table_rid(key: bytes, table: str) -> str:
    try:
        return key.decode()
    except UnicodeDecodeError:
        raise CorruptRecordError(f"the {table} table's key {key.hex()} is not a UTF-8 request id (damaged)") from None


def _check_checkpoint_payload(record: Record) -> None:
    """What every chain walk takes from the checkpoint; a CRC-valid but malformed one is refused here,
    once, instead of failing each walker with a KeyError."""
    p = record.payload
    kept = p.get("kept")
    ok = (isinstance(p.get("start"), int) and p["start"] >= 1 and isinstance(p.get("anchor"), bytes)
          and len(p["anchor"]) == len(GENESIS_HASH) and isinstance(kept, list)
          and all(isinstance(k, list) and len(k) == 2 and isinstance(k[0], int) and isinstance(k[1], bytes)
                  for k in kept))
    if not ok:
        raise CorruptRecordError("the checkpoint's payload is malformed (start, anchor, kept)", record.lsn)


def _short(lsns: list[int]) -> str:
    return "[" + ", ".join(map(str, lsns[:8])) + (", ...]" if len(lsns) > 8 else "]")


class LogReader:
    """Queries over a Wal; open another process's log with `LogReader.open(log_dir)`."""

    def __init__(self, wal: Wal) -> None:
        self.wal = wal

    @classmethod
    def open(cls, log_dir: str | os.PathLike[str]) -> LogReader:
        return cls(Wal.open(log_dir, readonly=True))

    def close(self) -> None:
        self.wal.close()

    def _begin(self) -> lmdb.Transaction[bytes]:
        try:
            return self.wal.env.begin()
        except lmdb.MapResizedError:  # the writer grew the map: adopt its size
            self.wal.env.set_mapsize(0)
            return self.wal.env.begin()

    def _read_chunk(self, resume: bytes, end: int | None, limit: int) -> tuple[list[Record], bytes | None]:
        """Records from key `resume` on; returns them and the key to resume at (None: nothing after)."""
        pairs, after = self.raw_chunk(resume, end, limit)
        return [decode_value(key, value) for key, value in pairs], after

    def raw_chunk(self, resume: bytes, end: int | None, limit: int) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        """Up to `limit` (key, value) pairs from key `resume` on, undecoded, and the key to resume at.

        Resuming by key, not by LSN + 1, and checking a key's length before comparing it with `end`,
        means a stray key (not 8 bytes) is always met and refused by `decode_value`, never skipped."""
        out: list[tuple[bytes, bytes]] = []
        stop = None if end is None else lsn_key(end + 1)
        with self._begin() as txn, txn.cursor(self.wal.records) as cur:
            if not cur.set_range(resume):
                return out, None
            for key, value in cur:
                if len(key) == 8 and stop is not None and key >= stop:
                    return out, None
                if len(out) >= limit:
                    return out, bytes(key)
                out.append((bytes(key), bytes(value)))
        return out, None

    def records(self, start: int = 1, end: int | None = None) -> Iterator[Record]:
        """Records with start <= LSN <= end, in order, read in bounded chunks."""
        resume: bytes | None = lsn_key(start) if start > 1 else b""
        while resume is not None:
            chunk, resume = self._read_chunk(resume, end, _CHUNK)
            yield from chunk

    def follow(self, start: int = 1, poll_s: float = 0.05,
               stop: threading.Event | None = None) -> Iterator[Record]:
        """Like `records` but waits for new records until `stop` is set."""
        resume = lsn_key(start) if start > 1 else b""
        while stop is None or not stop.is_set():
            chunk, after = self._read_chunk(resume, None, _CHUNK)
            yield from chunk
            if after is not None:
                resume = after
            elif chunk:
                resume = lsn_key(chunk[-1].lsn) + b"\x00"  # the next key after it, of any length
            else:
                time.sleep(poll_s)

    def last_lsn(self) -> int:
        """The highest LSN; a stray key after it (not 8 bytes) is not taken for an LSN (issue 10 C.13)."""
        with self._begin() as txn, txn.cursor(self.wal.records) as cur:
            found = cur.last()
            while found and len(cur.key()) != 8:
                found = cur.prev()
            return key_lsn(cur.key()) if found else 0

    def record_keys(self) -> list[bytes]:
        """Every records-table key, in key order (a keys-only pass)."""
        with self._begin() as txn, txn.cursor(self.wal.records) as cur:
            return [bytes(key) for key in cur.iternext(keys=True, values=False)]

    def stray_keys(self) -> list[bytes]:
        """Every records-table key that is not an 8-byte LSN, in key order."""
        return [key for key in self.record_keys() if len(key) != 8]

    def num_keys(self) -> int:
        """Entries in the records table, from LMDB's own count (no scan)."""
        with self._begin() as txn:
            return int(txn.stat(self.wal.records)["entries"])

    def request_records(self, rid: str) -> list[Record]:
        """Every incarnation's records of a rid, in LSN order: the finished ones found through the
        index, the running one (if any) by scanning from its BEGIN in `live`.

        Neither table is in the hash chain, so neither is trusted beyond what the records prove
        (issue 10 C.12): each indexed incarnation is read from its BEGIN to its FINISH and must be
        exactly the LSNs the index lists; anything else raises CorruptRecordError."""
        key = rid.encode()
        with self._begin() as txn:
            packed = txn.get(key, db=self.wal.index)
            begin = txn.get(key, db=self.wal.live)
        indexed = [] if packed is None else unpack_lsns(packed)
        records: list[Record] = []
        while len(records) < len(indexed):
            records.extend(self._proven_incarnation(rid, indexed, len(records)))
        if begin is not None:
            begin_lsn = _live_lsn(rid, begin)
            running = self._incarnation(rid, begin_lsn)
            if not running or running[0].kind is not Kind.BEGIN or running[0].lsn != begin_lsn:
                raise CorruptRecordError(f"the live table names LSN {begin_lsn} as the BEGIN of {rid!r}, but "
                                         "no BEGIN of it is there (live table rewritten or damaged)", begin_lsn)
            if records and running[0].lsn <= records[-1].lsn:
                raise CorruptRecordError(f"the live table names a BEGIN of {rid!r} inside an indexed incarnation",
                                         begin_lsn)
            records.extend(running)
        return records

    def _proven_incarnation(self, rid: str, indexed: list[int], at: int) -> list[Record]:
        """The incarnation the index lists from position `at`, read from the records themselves."""
        records = self._incarnation(rid, indexed[at])
        lsns = [r.lsn for r in records]
        if (not records or records[0].kind is not Kind.BEGIN or records[-1].kind is not Kind.FINISH
                or lsns != indexed[at:at + len(lsns)]):
            raise CorruptRecordError(
                f"the index lists LSNs {_short(indexed[at:])} for {rid!r}, but its records from LSN {indexed[at]} "
                f"are {_short(lsns)}{'' if records and records[-1].kind is Kind.FINISH else ' (no FINISH)'}: "
                "the per-request index was rewritten or damaged", indexed[at])
        return records

    def _incarnation(self, rid: str, begin_lsn: int) -> list[Record]:
        """The rid's records from `begin_lsn` up to its FINISH (or the end of the log); [] when the
        record there is not the rid's.

        Reads every record in between, so it costs the request's lifetime in records: only values
        holding the rid's msgpack bytes are decoded (well under a µs for each other one, not ~5)."""
        needle = msgpack.packb(rid)
        out: list[Record] = []
        for key, value in self._pairs_from(lsn_key(begin_lsn)):
            record = decode_value(key, value) if needle in value or len(key) != 8 else None
            if record is None or record.rid != rid:
                if not out:
                    return out
                continue
            if out and record.kind is Kind.BEGIN:
                return out
            out.append(record)
            if record.kind is Kind.FINISH:
                return out
        return out

    def _pairs_from(self, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Undecoded pairs from `key` on, lazily, a bounded number per read txn."""
        resume: bytes | None = key
        while resume is not None:
            with self._begin() as txn, txn.cursor(self.wal.records) as cur:
                if not cur.set_range(resume):
                    return
                resume = None
                for n, (k, value) in enumerate(cur):
                    if n >= _WINDOW_CHUNK:
                        resume = k
                        break
                    yield k, value

    def running_records(self, rid: str) -> list[Record]:
        """The records of a rid's running incarnation (from its BEGIN in `live`); [] when none runs."""
        with self._begin() as txn:
            begin = txn.get(rid.encode(), db=self.wal.live)
        return [] if begin is None else self._incarnation(rid, _live_lsn(rid, begin))

    def request_lsns(self, rid: str) -> list[int]:
        return [r.lsn for r in self.request_records(rid)]

    def request_ids(self) -> list[str]:
        """Every request in the log, finished (index) or running (live table)."""
        with self._begin() as txn:
            keys = {k for k, _ in txn.cursor(self.wal.index)} | {k for k, _ in txn.cursor(self.wal.live)}
        return sorted(_table_rid(bytes(k), "index or live") for k in keys)

    def touch_index_edges(self) -> None:
        """Read the per-request index's first and last entries: its root page and both edges, with no
        scan. A damaged page there raises `lmdb.Error` (MDB_CORRUPTED), as the first index write
        after a restart would, in the writer thread, where it stops the server."""
        with self._begin() as txn, txn.cursor(self.wal.index) as cur:
            if cur.first():
                cur.value()
                cur.last()
                cur.value()

    def live_begin(self, rid: str) -> int | None:
        """The BEGIN LSN the live table gives for a rid (unproven), or None."""
        with self._begin() as txn:
            value = txn.get(rid.encode(), db=self.wal.live)
        return None if value is None else _live_lsn(rid, value)

    def live_request_ids(self) -> list[str]:
        """Requests with a BEGIN and no FINISH, in BEGIN order."""
        with self._begin() as txn, txn.cursor(self.wal.live) as cur:
            entries = sorted(cur, key=lambda kv: kv[1])
        return [_table_rid(bytes(key), "live") for key, _ in entries]

    def rebuild(self, rid: str) -> RequestState:
        state = replay(self.request_records(rid))
        if state is None:
            raise UnknownRequestError(f"no BEGIN for request {rid!r} in {self.wal.log_dir}")
        return state

    def checkpoint(self) -> Record | None:
        with self._begin() as txn:
            key = txn.get(META_CHECKPOINT, db=self.wal.meta)
            if key is None:
                return None
            value = txn.get(key, db=self.wal.records)
        if value is None:
            raise CorruptRecordError("the checkpoint record named in meta is missing", key_lsn(key))
        record = decode_value(key, value)
        if record.kind is not Kind.CHECKPOINT:
            raise CorruptRecordError(f"meta names a {record.kind.name} record as the checkpoint", record.lsn)
        _check_checkpoint_payload(record)
        return record

    def chain_walker(self) -> ChainWalker:
        """A walker for the whole log from its first record, seeded from the checkpoint if any."""
        cp = self.checkpoint()
        if cp is None:
            return ChainWalker(1, GENESIS_HASH, {}, 1)
        kept = {int(lsn): bytes(prev) for lsn, prev in cp.payload["kept"]}
        return ChainWalker(cp.payload["start"], bytes(cp.payload["anchor"]), kept, cp.payload["start"])

    def verify(self) -> VerifyReport:
        """Check every record's CRC, LSN contiguity and the whole hash chain."""
        walker = self.chain_walker()
        first, count = 0, 0
        for record in self.records():
            walker.check(record)
            first, count = first or record.lsn, count + 1
        walker.finish()
        cp = self.checkpoint()
        return VerifyReport(count, first, walker.expected - 1, cp.lsn if cp else None, walker.prev_hash)

    def verify_tail(self, num_records: int = 256) -> tuple[int, bytes, list[Record]]:
        """Check the last records (CRC, contiguity, chain among them); return (last LSN, its hash, the
        records read: those below the checkpoint's start too, unchained here)."""
        last = self.last_lsn()
        if last == 0:
            return 0, GENESIS_HASH, []
        read = list(self.records(max(1, last - num_records + 1)))
        cut = self._cut()
        tail = [r for r in read if r.lsn >= cut]
        for prev, record in zip(tail, tail[1:]):
            if record.lsn != prev.lsn + 1:
                raise CorruptRecordError(f"LSN gap after {prev.lsn}", record.lsn)
            if chain(prev.chain_hash, record.body) != record.chain_hash:
                raise CorruptRecordError("hash chain broken", record.lsn)
        return last, tail[-1].chain_hash if tail else GENESIS_HASH, read

    def _cut(self) -> int:
        cp = self.checkpoint()
        return 1 if cp is None else int(cp.payload["start"])
