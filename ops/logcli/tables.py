"""`verify`'s check of the two tables outside the hash chain (issue 10 C.12): `by_rid` must list
exactly the LSNs of each rid's finished incarnations, `live` exactly the requests begun and not
finished. Runs in a forked child (`run_isolated`) after the record scan, from what it proved.

A log a server is still writing may have grown since the scan: LSNs past the scanned end are
neither required nor refused.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import lmdb

from commitlog import LogReader
from commitlog.codec import key_lsn, unpack_lsns
from commitlog.isolate import Outcome, run_isolated
from ops.logcli.invariants import Incarnation, ReqCheck, Violation, lsn_digest


@dataclass(frozen=True, slots=True)
class Proven:
    """What the record scan proved, per rid."""

    finished: dict[str, list[Incarnation]]  # in BEGIN order
    running: dict[str, ReqCheck]  # begun, no FINISH at the end of the scan
    last_lsn: int  # the scan's end


def proven(finished: list[Incarnation], running: dict[str, ReqCheck], last_lsn: int) -> Proven:
    by_rid: dict[str, list[Incarnation]] = {}
    for inc in sorted(finished, key=lambda i: i[1]):
        by_rid.setdefault(inc[0], []).append(inc)
    return Proven(by_rid, running, last_lsn)


def check_tables(log_dir: str, facts: Proven) -> Outcome:
    """Both tables' violations, each table read in a forked child of its own (`run_isolated`).

    A page of the index that LMDB cannot read (or that kills the child) is reported as an index
    violation, not as an unreadable log: the records are sound, the index is what salvage rebuilds, and
    a restart, which reads only the index's edges, does not refuse such a log either (FORMAT.md
    "Recovery"). Any other failure comes back as the child's outcome."""
    (index,) = run_isolated([(_index_violations, (log_dir, facts))])
    if index.status in ("unreadable", "crashed"):
        found: list[Violation] = [Violation(0, None, "index", f"the index has a page LMDB cannot read ({index.message}): "
                                                              "readers refuse the log; salvage rebuilds the index")]
        finished_since: set[str] = set()
    elif not index.ok:
        return index
    else:
        found, finished_since = index.value
    (live,) = run_isolated([(_live_violations, (log_dir, facts, finished_since))])
    return live if not live.ok else Outcome("ok", found + live.value)


def _index_violations(log_dir: str, facts: Proven) -> tuple[list[Violation], set[str]]:
    """And the rids running at the scan's end that are indexed (finished) since."""
    reader = LogReader.open(log_dir)
    try:
        finished_since: set[str] = set()
        with reader._begin() as txn:
            end = _last_lsn(txn.cursor(reader.wal.records))
            out = list(_check_index(txn.cursor(reader.wal.index), facts, finished_since))
            out.extend(_past_end(txn.cursor(reader.wal.index), end))
        return out, finished_since
    finally:
        reader.close()


def _live_violations(log_dir: str, facts: Proven, finished_since: set[str]) -> list[Violation]:
    reader = LogReader.open(log_dir)
    try:
        with reader._begin() as txn:
            return list(_check_live(txn.cursor(reader.wal.live), facts, finished_since))
    finally:
        reader.close()


def _last_lsn(cursor: lmdb.Cursor) -> int:
    found = cursor.last()
    while found and len(cursor.key()) != 8:
        found = cursor.prev()
    return key_lsn(cursor.key()) if found else 0


def _past_end(cursor: lmdb.Cursor, end: int) -> Iterator[Violation]:
    """An index entry naming an LSN the log does not hold (records cut off the end, or a forged entry)."""
    for key, value in cursor:
        if len(value) >= 8 and len(value) % 8 == 0 and key_lsn(bytes(value[-8:])) > end:
            yield Violation(end, _rid(bytes(key)), "index", f"index entry lists LSN {key_lsn(bytes(value[-8:]))}, "
                                                            f"past the log's last record (LSN {end})")


def _rid(key: bytes) -> str | None:
    try:
        return key.decode()
    except UnicodeDecodeError:
        return None


def _check_index(cursor: lmdb.Cursor, facts: Proven, finished_since: set[str]) -> Iterator[Violation]:
    seen: set[str] = set()
    for key, value in cursor:
        rid = _rid(bytes(key))
        if rid is None:
            yield Violation(0, None, "index", f"index key {bytes(key).hex()} is not a UTF-8 request id")
            continue
        seen.add(rid)
        if len(value) % 8:
            yield Violation(0, rid, "index", f"index entry of {len(value)} bytes is not a list of 8-byte LSNs")
            continue
        yield from _check_entry(rid, unpack_lsns(bytes(value)), facts, finished_since)
    for rid, incs in facts.finished.items():
        if rid not in seen:
            yield Violation(incs[0][1], rid, "index", f"finished (BEGIN at LSN {incs[0][1]}) but has no index entry: "
                                                      "audit and GET /requests/{rid} cannot find it")


def _check_entry(rid: str, lsns: list[int], facts: Proven, finished_since: set[str]) -> Iterator[Violation]:
    """Walk the entry incarnation by incarnation, in the order the records proved them."""
    pos = 0
    for _rid, begin, count, digest in facts.finished.get(rid, []):
        segment = lsns[pos:pos + count]
        if segment[:1] != [begin] or lsn_digest(segment) != digest:
            yield Violation(begin, rid, "index", f"index entry does not list the {count} record(s) of the incarnation "
                                                 f"begun at LSN {begin} (it lists {_short(lsns[pos:])}): rewritten "
                                                 "or damaged; readers refuse it, salvage rebuilds it")
            return
        pos += count
    running = facts.running.get(rid)
    if running is not None and pos < len(lsns) and lsns[pos] == running.begin_lsn:
        if lsns[pos:pos + len(running.lsns)] != running.lsns:
            yield Violation(running.begin_lsn, rid, "index", "index entry does not list the records of the incarnation "
                                                             f"begun at LSN {running.begin_lsn}: rewritten or damaged")
            return
        finished_since.add(rid)  # finished after the scan: no live entry any more
        return
    extra = [lsn for lsn in lsns[pos:] if lsn <= facts.last_lsn]
    if extra:
        yield Violation(extra[0], rid, "index", f"index entry lists LSN(s) {_short(extra)} that no finished incarnation "
                                                "of this rid holds: rewritten or damaged; readers refuse it")


def _check_live(cursor: lmdb.Cursor, facts: Proven, finished_since: set[str]) -> Iterator[Violation]:
    matched: set[str] = set()
    for key, value in cursor:
        rid = _rid(bytes(key))
        if rid is None or len(value) != 8:
            yield Violation(0, rid, "live", f"live entry {bytes(key).hex()} -> {bytes(value).hex()} is malformed")
            continue
        begin = key_lsn(bytes(value))
        running = facts.running.get(rid)
        if running is not None and running.begin_lsn == begin:
            matched.add(rid)
        elif begin <= facts.last_lsn:  # a later one began after the scan
            yield Violation(begin, rid, "live", f"live table names LSN {begin} as this request's BEGIN, but no "
                                                "running request begins there: a restart would refuse the log")
    for rid, running in facts.running.items():
        if rid not in matched and rid not in finished_since:
            yield Violation(running.begin_lsn, rid, "live", f"running (BEGIN at LSN {running.begin_lsn}, no FINISH) "
                                                            "but missing from the live table: a restart would never "
                                                            "finish it as interrupted")


def _short(lsns: list[int]) -> str:
    return "[" + ", ".join(map(str, lsns[:8])) + (", ...]" if len(lsns) > 8 else "]")



