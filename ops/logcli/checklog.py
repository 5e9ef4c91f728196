"""Check a whole log: records, chain and invariants, over LSN ranges in parallel children."""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from commitlog import LogReader
from commitlog.scan import ChainBreak, Scan
from ops.logcli.invariants import Merged, RangeChecker, RangeResult, Violation, merge
from ops.logcli.isolate import Outcome, run_isolated
from ops.logcli.tables import check_tables, proven

RECORDS_PER_JOB = 250_000  # below this, another process costs more than it saves


@dataclass(frozen=True, slots=True)
class ExpectedHead:
    chain_hash: bytes
    lsn: int | None = None  # when published as LSN:HASH, a mismatch can name the LSN


@dataclass(frozen=True, slots=True)
class _Plan:
    cut: int
    last_lsn: int


@dataclass(slots=True)
class _RangeOutcome:
    result: RangeResult
    num_records: int
    first_lsn: int
    last_lsn: int
    head: bytes
    head_lsn: int
    breaks: list[ChainBreak]
    watch_lsn: int | None
    probe_hash: bytes | None
    lost: list[int]
    lost_ranges: list[tuple[int, int]]


@dataclass(slots=True)
class LogCheck:
    log_dir: str
    num_records: int = 0
    first_lsn: int = 0
    last_lsn: int = 0
    head: bytes = b""
    head_lsn: int = 0
    checkpoint_start: int = 1
    lost: list[int] = field(default_factory=list)
    lost_ranges: list[tuple[int, int]] = field(default_factory=list)
    merged: Merged = field(default_factory=Merged)
    failure: Outcome | None = None  # corrupt, unreadable or crashed: nothing else is trustworthy

    @property
    def violations(self) -> list[Violation]:
        return self.merged.violations.items

    @property
    def exit_code(self) -> int:
        return 2 if self.failure is not None else 1 if self.merged.violations.count else 0


def _plan(log_dir: str) -> _Plan:
    reader = LogReader.open(log_dir)
    try:
        cp = reader.checkpoint()
        return _Plan(1 if cp is None else int(cp.payload["start"]), reader.last_lsn())
    finally:
        reader.close()


def _check_range(log_dir: str, start: int, end: int | None, expect: ExpectedHead | None,
                 counts: Any, slot: int) -> _RangeOutcome:
    reader = LogReader.open(log_dir)
    try:
        scan = Scan(reader, start, end, expect.chain_hash if expect else None, expect.lsn if expect else None,
                    progress=lambda n: counts.__setitem__(slot, n))
        checker = RangeChecker()
        feed = checker.feed
        for lsn, kind, _ts, rid, payload in scan:
            feed(lsn, kind, rid, payload)
        return _RangeOutcome(checker.result(), scan.num_records, scan.first_lsn, scan.last_lsn, scan.head,
                             scan.head_lsn, scan.breaks, scan.watch_lsn, scan.probe_hash, scan.lost,
                             scan.lost_ranges)
    finally:
        reader.close()


def _ranges(plan: _Plan, jobs: int) -> list[tuple[int, int | None]]:
    span = max(0, plan.last_lsn - plan.cut + 1)
    jobs = max(1, min(jobs, span // RECORDS_PER_JOB))
    bounds = [plan.cut + span * k // jobs for k in range(1, jobs)]
    starts = [1, *bounds]
    ends: list[int | None] = [b - 1 for b in bounds]
    return list(zip(starts, [*ends, None]))


def check_log(log_dir: str, expect: ExpectedHead | None = None, jobs: int | None = None,
              progress: Callable[[int, int], None] | None = None) -> LogCheck:
    """Verify everything `tokenledger verify` promises; never raises for what the file holds."""
    report = LogCheck(log_dir)
    (planned,) = run_isolated([(_plan, (log_dir,))])
    if not planned.ok:
        report.failure = planned
        return report
    plan: _Plan = planned.value
    report.checkpoint_start = plan.cut
    ranges = _ranges(plan, jobs or len(os.sched_getaffinity(0)))
    counts = multiprocessing.get_context("fork").Array("q", len(ranges), lock=False)
    total = max(1, plan.last_lsn - plan.cut + 1)
    tick = None if progress is None else (lambda: progress(sum(counts), total))
    outcomes = run_isolated([(_check_range, (log_dir, s, e, expect, counts, i)) for i, (s, e) in enumerate(ranges)],
                            tick)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        report.failure = min(failed, key=lambda o: (o.lsn is None, o.lsn or 0))
        return report
    _summarise(report, [o.value for o in outcomes], expect)
    _check_tables(report)
    return report


def _check_tables(report: LogCheck) -> None:
    """The index and live tables against what the scan proved (in a child: it reads LMDB)."""
    facts = proven(report.merged.finished, report.merged.open, report.last_lsn)
    tables = check_tables(report.log_dir, facts)
    if not tables.ok:
        report.failure = tables
        return
    out = report.merged.violations
    for v in tables.value:
        out.add(v.lsn, v.rid, v.check, v.message)
    out.items.sort(key=lambda v: v.lsn)


def _summarise(report: LogCheck, parts: list[_RangeOutcome], expect: ExpectedHead | None) -> None:
    report.merged = merge([p.result for p in parts])
    report.num_records = sum(p.num_records for p in parts)
    report.first_lsn = min((p.first_lsn for p in parts if p.num_records), default=0)
    report.last_lsn = max(p.last_lsn for p in parts)
    tail = max(parts, key=lambda p: p.head_lsn)
    report.head, report.head_lsn = tail.head, tail.head_lsn
    report.lost, report.lost_ranges = parts[0].lost, parts[0].lost_ranges
    out = report.merged.violations
    for part in parts:
        for brk in part.breaks:
            out.add(brk.lsn, None, brk.check, brk.message)
    if expect is not None:
        _check_head(report, parts, expect)
    out.items.sort(key=lambda v: v.lsn)


def _check_head(report: LogCheck, parts: list[_RangeOutcome], expect: ExpectedHead) -> None:
    if any(p.watch_lsn is not None for p in parts):
        return  # the published head is in the chain; later records only extend it
    out, lsn = report.merged.violations, expect.lsn
    probe = next((p.probe_hash for p in parts if p.probe_hash is not None), None)
    if lsn is not None and probe is not None:
        out.add(lsn, None, "head", f"chain hash at LSN {lsn} is {probe.hex()}, not the published head: "
                                   f"a record at or before LSN {lsn} was edited, inserted or removed")
    elif lsn is not None and lsn > report.head_lsn:
        out.add(report.head_lsn + 1, None, "head", f"the log ends at LSN {report.head_lsn}, before the published "
                                                    f"head's LSN {lsn}: records were removed from the end")
    elif lsn is not None and lsn < report.checkpoint_start:
        out.add(lsn, None, "head", f"retention dropped LSN {lsn} (checkpoint start {report.checkpoint_start}); "
                                   "the published head can no longer be proven")
    else:
        out.add(report.head_lsn, None, "head", "the published head is not in the hash chain: the log was rewritten "
                                               "or cut short (publish it as LSN:HASH to name the first bad LSN)")
