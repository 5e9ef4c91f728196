"""Salvage's reading half: every readable (key, value) of a damaged log, read in forked children.

A damaged B-tree page can kill the reading process (SIGBUS, SIGSEGV, SIGABRT) or make LMDB raise
MDB_CORRUPTED; either way only that child is lost (issue 10 D.16). The parent then reads the longest
prefix that still reads, probes forward by LSN for the first key past the damage, and goes on
from there, so the records after a damaged page are copied too, and the skipped LSNs are named.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from commitlog.codec import META_CHECKPOINT, key_lsn, lsn_key
from commitlog.isolate import Outcome, run_isolated
from commitlog.reader import LogReader

READ_CHUNK = 65536  # pairs per child: fewer forks of a parent that grows; a crash costs ~16 more
_MAX_LSN = (1 << 64) - 1
Pair = tuple[bytes, bytes]


@dataclass(slots=True)
class RawLog:
    """What could be read: pairs in key order, the LSN runs that could not, the source checkpoint."""

    pairs: list[Pair] = field(default_factory=list)
    unreadable: list[tuple[int, int]] = field(default_factory=list)  # [first, last] LSNs behind damage
    checkpoint: Pair | None = None  # (key, value) of the source's newest CHECKPOINT, when readable
    open_error: str | None = None  # the source could not be opened at all
    tail_unknown: bool = False  # nothing after the last unreadable run reads: how much it held is unknown


def _reader_call(log_dir: str, fn_name: str, *args: object) -> object:
    reader = LogReader.open(log_dir)
    try:
        return globals()[fn_name](reader, *args)
    finally:
        reader.close()


def _chunk(reader: LogReader, resume: bytes, limit: int) -> tuple[list[Pair], bytes | None]:
    """Up to `limit` pairs from key `resume` on, and the key after them (None at the end)."""
    return reader.raw_chunk(resume, None, limit)


def _probe(reader: LogReader, key: bytes) -> bytes | None:
    """The first key at or after `key`, if the path to it reads (None: no key after it)."""
    with reader._begin() as txn, txn.cursor(reader.wal.records) as cur:
        return bytes(cur.key()) if cur.set_range(key) else None


def _last_key(reader: LogReader) -> bytes | None:
    with reader._begin() as txn, txn.cursor(reader.wal.records) as cur:
        return bytes(cur.key()) if cur.last() else None


def _checkpoint(reader: LogReader) -> Pair | None:
    with reader._begin() as txn:
        key = txn.get(META_CHECKPOINT, db=reader.wal.meta)
        value = None if key is None else txn.get(key, db=reader.wal.records)
        return None if key is None or value is None else (bytes(key), bytes(value))


def _run(log_dir: str, fn_name: str, *args: object) -> Outcome:
    (outcome,) = run_isolated([(_reader_call, (log_dir, fn_name, *args))])
    return outcome


def read_raw(log_dir: str) -> RawLog:
    raw = RawLog()
    opened = _run(log_dir, "_checkpoint")
    if opened.ok:
        raw.checkpoint = opened.value
    elif not _run(log_dir, "_last_key").ok:  # neither table reads: nothing to navigate
        raw.open_error = opened.message
        return raw
    resume: bytes | None = b""
    while resume is not None:
        got = _run(log_dir, "_chunk", resume, READ_CHUNK)
        if got.ok:
            pairs, resume = got.value
            raw.pairs.extend(pairs)
            continue
        before = len(raw.pairs)
        raw.pairs.extend(_readable_prefix(log_dir, resume))
        if len(raw.pairs) > before or not resume:
            after = next((key_lsn(k) for k, _ in reversed(raw.pairs) if len(k) == 8), 0)
            lost_from = after + 1
        else:  # the key we resumed at is itself unreadable: get strictly past it
            after = key_lsn(resume[:8].ljust(8, b"\0"))
            lost_from = after if len(resume) == 8 else after + 1
        resume = _past_damage(log_dir, raw, after, lost_from)
    return raw


def _readable_prefix(log_dir: str, resume: bytes) -> list[Pair]:
    """The longest run of pairs from `resume` that reads without a crash (binary search on its length)."""
    good: list[Pair] = []
    low, high = 0, READ_CHUNK  # `low` pairs read; `high` do not
    while high - low > 1:
        mid = (low + high) // 2
        got = _run(log_dir, "_chunk", resume, mid)
        if got.ok:
            low, good = mid, got.value[0]
        else:
            high = mid
    return good


def _past_damage(log_dir: str, raw: RawLog, after: int, lost_from: int) -> bytes | None:
    """Probe LSNs after `after` at doubling distances, then narrow down to the first that reads; the
    LSNs from `lost_from` up to it are recorded unreadable. None when nothing after the damage reads.

    Every call starts strictly past the previous one's `after`, so a key that reads but whose value
    does not is passed on the next round: the loop in `read_raw` always ends."""
    step, failed = 1, after
    probe: Outcome | None = None
    while after + step <= _MAX_LSN:
        probe = _run(log_dir, "_probe", lsn_key(after + step))
        if probe.ok:
            break
        failed, step = after + step, step * 2
    if probe is None or not probe.ok:
        _unreadable_to_end(log_dir, raw, lost_from)
        return None
    low, high, found = failed, after + step, probe.value  # probes at `low` fail, at `high` read
    while high - low > 1:
        mid = (low + high) // 2
        probe_mid = _run(log_dir, "_probe", lsn_key(mid))
        if probe_mid.ok:
            high, found = mid, probe_mid.value
        else:
            low = mid
    if found is None:
        _unreadable_to_end(log_dir, raw, lost_from)
        return None
    first = key_lsn(found[:8].ljust(8, b"\0"))
    if first > lost_from:
        raw.unreadable.append((lost_from, first - 1))
    return found


def _unreadable_to_end(log_dir: str, raw: RawLog, lost_from: int) -> None:
    """Nothing after the damage reads: the LSNs from `lost_from` to the table's last key are lost."""
    last = _run(log_dir, "_last_key")
    known = last.ok and last.value is not None and len(last.value) == 8
    end = key_lsn(last.value) if known else lost_from
    raw.unreadable.append((lost_from, max(lost_from, end)))
    raw.tail_unknown = not known
    return None
