"""What `replay`, `audit` and `export` prove as they walk a whole log, so they refuse what `verify`
rejects instead of printing an account the log does not back: LSN contiguity and the hash chain from
the checkpoint (a removed or edited record), and, after a complete walk, the per-request index and
the live table against the records (the same check as `verify`'s, in a forked child).

Protocol invariants (I2, I6, I7 ...) are `verify`'s alone: a log that records a server bug is intact,
and the readers are how one looks at it.
"""
from __future__ import annotations

from collections.abc import Callable

from commitlog import CorruptRecordError, Record
from commitlog.isolate import Outcome
from commitlog.reader import ChainWalker
from ops.logcli.invariants import RangeChecker, Violation, merge
from ops.logcli.tables import check_tables, proven

_TABLE_NAMES = {"index": "per-request index (by_rid)", "live": "live table"}


class ReadCheck:
    """Feed every record of a walk from LSN 1, in order; `finish` after the last one."""

    def __init__(self, walker: ChainWalker) -> None:
        self._walker = walker
        self._requests = RangeChecker()  # verify's per-request bookkeeping: what the tables must say
        self._last_lsn = 0

    def feed(self, record: Record) -> None:
        self._walker.check(record)
        self._requests.feed(record.lsn, record.kind, record.rid, record.payload)
        self._last_lsn = record.lsn

    def finish(self, log_dir: str, whole: bool, error: Callable[[Outcome], Exception]) -> None:
        """`whole`: the walk reached the end of the log (not `--until-lsn`), so the tables are checked."""
        if not whole:
            return
        self._walker.finish()
        merged = merge([self._requests.result()])
        facts = proven(merged.finished, merged.open, self._last_lsn)
        tables = check_tables(log_dir, facts)
        if not tables.ok:
            raise error(tables)
        if tables.value:
            first = min(tables.value, key=lambda v: v.lsn)
            raise CorruptRecordError(_message(first, len(tables.value)), first.lsn or None)


def _message(v: Violation, count: int) -> str:
    more = f" (and {count - 1} more such problem(s); `tokenledger verify` lists them)" if count > 1 else ""
    rid = f"request {v.rid!r}: " if v.rid else ""
    return f"the {_TABLE_NAMES.get(v.check, v.check)} disagrees with the records: {rid}{v.message}{more}"
