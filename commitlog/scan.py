"""One fast pass over every record: CRC and structure, LSN contiguity and the hash chain.

Unlike `LogReader.verify`, which stops at the first defect, a scan yields each record as
plain fields and collects chain and contiguity breaks, so a checker can list them all;
only a record it cannot decode stops it (`CorruptRecordError`). Used by `tokenledger verify`.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

import lmdb

from commitlog.codec import GENESIS_HASH, Payload, key_lsn, lsn_key, scan_value, stray_key_message
from commitlog.errors import CorruptRecordError
from commitlog.reader import LogReader

SCAN_CHUNK = 65536  # records per read txn: long-lived read txns stop LMDB from reusing pages
ScannedRecord = tuple[int, int, int, "str | None", Payload]  # lsn, kind, ts_ns, rid, payload


@dataclass(frozen=True, slots=True)
class ChainBreak:
    lsn: int
    message: str
    check: str = "chain"  # or "key": a records-table key that is not an 8-byte LSN


@dataclass(slots=True)
class Scan:
    """Iterate it once; afterwards `head`, `head_lsn`, `breaks` and `watch_lsn` describe the log."""

    reader: LogReader
    start: int = 1  # scan [start, end]; a start above the checkpoint's takes its chain from start - 1
    end: int | None = None
    watch: bytes | None = None  # a chain hash to look for (a published head)
    probe: int | None = None  # an LSN whose chain hash to remember (`probe_hash`)
    progress: Callable[[int], None] | None = None  # called with the number of records read so far
    breaks: list[ChainBreak] = field(default_factory=list)
    num_records: int = 0
    first_lsn: int = 0
    head_lsn: int = 0
    head: bytes = GENESIS_HASH
    watch_lsn: int | None = None
    probe_hash: bytes | None = None
    last_lsn: int = 0
    cut: int = 1
    kept: dict[int, bytes] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)  # LSNs a salvage could not copy
    lost_ranges: list[tuple[int, int]] = field(default_factory=list)  # ... runs of them, [first, last]
    below: tuple[int, bytes] = (0, GENESIS_HASH)  # the last record read below the cut: (LSN, stored hash)

    def __iter__(self) -> Iterator[ScannedRecord]:
        """Ranges partition the key space, not the LSNs: [key(start), key(end + 1)), the first from the
        table's first key. So a key of any length lies in exactly one range and is seen (issue 10 C.13)."""
        self._start()
        resume: bytes | None = None if self.start <= 1 else lsn_key(self.start)
        while True:
            resume = yield from self._read_chunk(resume)
            if self.progress is not None:
                self.progress(self.num_records)
            if resume is None:
                break
        if self.start <= 1:  # the scan that covers the region below the checkpoint
            for lsn in sorted(self.kept):
                self.breaks.append(ChainBreak(lsn, "listed in the checkpoint as kept, but missing (record removed)"))

    def _start(self) -> None:
        cp = self.reader.checkpoint()
        if cp is not None:
            self.cut, self.head = int(cp.payload["start"]), bytes(cp.payload["anchor"])
            self.kept = {int(lsn): bytes(prev) for lsn, prev in cp.payload["kept"]}
            self.lost = [int(lsn) for lsn in cp.payload.get("lost", [])]
            self.lost_ranges = [(int(a), int(b)) for a, b in cp.payload.get("lost_ranges", [])]
        self.head_lsn = self.cut - 1
        if self.start > self.cut:
            self._seed_from_predecessor()
        if self.watch is not None and self.watch == self.head:
            self.watch_lsn = self.head_lsn

    def _seed_from_predecessor(self) -> None:
        """Take the chain from the stored hash of the last record before `start` (its own scan checks it)."""
        with self.reader._begin() as txn, txn.cursor(self.reader.wal.records) as cur:
            found = cur.prev() if cur.set_range(lsn_key(self.start)) else cur.last()
            while found and len(cur.key()) != 8:  # a stray key is the other range's to report
                found = cur.prev()
            if found and key_lsn(cur.key()) >= self.cut:
                self.head_lsn, self.head = key_lsn(cur.key()), bytes(cur.value()[6:38])

    def _read_chunk(self, resume: bytes | None) -> Generator[ScannedRecord, None, bytes | None]:
        """Up to SCAN_CHUNK records from key `resume` (None: the first key), yielded inside one read txn;
        returns the key to resume at, or None at the range's end.

        The hot loop of `verify`: the per-record work is inlined and records are not collected
        (holding a chunk of payloads makes the cyclic GC rescan them)."""
        lsn, cut, watch, probe = self.last_lsn or self.start - 1, self.cut, self.watch, self.probe
        stop = None if self.end is None else lsn_key(self.end + 1)
        head, head_lsn, count, first, last = self.head, self.head_lsn, 0, 0, 0
        try:
            with self.reader._begin() as txn, txn.cursor(self.reader.wal.records) as cur:
                if not (cur.first() if resume is None else cur.set_range(resume)):
                    return None
                for key, value in cur:
                    if stop is not None and key >= stop:
                        return None
                    if count >= SCAN_CHUNK:
                        return key
                    if len(key) != 8:
                        self.breaks.append(ChainBreak(lsn, stray_key_message(key), "key"))
                        continue
                    lsn = int.from_bytes(key, "big")
                    if lsn < cut:
                        kind, ts_ns, rid, payload, chain_hash = self._check_kept(lsn, value, head)
                    else:
                        kind, ts_ns, rid, payload, chain_hash, chained = scan_value(lsn, value, head)
                        if lsn != head_lsn + 1 or not chained:
                            self._chain_break(lsn, head_lsn, chained)
                        head, head_lsn = chain_hash, lsn  # resynchronise: one defect, one report
                    if chain_hash == watch:
                        self.watch_lsn = lsn
                    if lsn == probe:
                        self.probe_hash = chain_hash
                    first, last, count = first or lsn, lsn, count + 1
                    yield lsn, kind, ts_ns, rid, payload
                return None
        except lmdb.Error as exc:
            raise CorruptRecordError(f"the LMDB file is damaged after this record ({exc})", lsn + 1) from None
        finally:
            self.head, self.head_lsn = head, head_lsn
            self.num_records += count
            self.first_lsn = self.first_lsn or first
            self.last_lsn = last or self.last_lsn

    def _check_kept(self, lsn: int, value: bytes, anchor: bytes) -> tuple[int, int, str | None, Payload, bytes]:
        """A record below the cut: chained from the predecessor hash the checkpoint lists for it.

        A listed hash proves nothing by itself (issue 10 C.11: a forged CHECKPOINT can list, for the
        record after an edited one, the hash it was chained from before the edit). So where the
        record at `lsn - 1` exists, the listed hash must be its stored hash; and the anchor must be
        the stored hash of the record at `cut - 1`. Then an edit changes every later stored hash."""
        prev = self.kept.pop(lsn, None)
        kind, ts_ns, rid, payload, chain_hash, chained = scan_value(lsn, value, prev or GENESIS_HASH)
        below_lsn, below_hash = self.below
        if prev is None:
            self.breaks.append(ChainBreak(lsn, "precedes the checkpoint's start and is not listed in it (inserted)"))
        elif below_lsn == lsn - 1 and below_lsn and prev != below_hash:
            self.breaks.append(ChainBreak(lsn, f"the checkpoint lists a predecessor hash that is not the stored hash "
                                               f"of LSN {below_lsn} (forged checkpoint, or a record before it edited)"))
        elif not chained:
            self.breaks.append(ChainBreak(lsn, "hash chain broken (record edited)"))
        if lsn == self.cut - 1 and chain_hash != anchor:
            self.breaks.append(ChainBreak(lsn, "the checkpoint's anchor is not this record's stored hash "
                                               "(forged checkpoint, or this record edited)"))
        self.below = (lsn, chain_hash)
        return kind, ts_ns, rid, payload, chain_hash

    def _chain_break(self, lsn: int, head_lsn: int, chained: bool) -> None:
        if lsn != head_lsn + 1:
            self.breaks.append(ChainBreak(lsn, f"LSN gap: records {head_lsn + 1}..{lsn - 1} removed"))
        else:
            self.breaks.append(ChainBreak(lsn, "hash chain broken (record edited, inserted or removed)"))
