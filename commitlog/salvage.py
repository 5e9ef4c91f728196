"""Salvage: copy every intact record of a damaged log into a fresh log that verifies.

Intact records keep their LSNs and bodies; the chain is recomputed over them and a closing
CHECKPOINT lists each one (FORMAT.md, "Salvage"), naming what was lost. The source is read in
forked children (`commitlog.salvage_read`), so a damaged page costs its records, not the salvage.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from commitlog.codec import (
    GENESIS_HASH,
    META_CHECKPOINT,
    EncodedGroup,
    Entry,
    Kind,
    Record,
    decode_value,
    encode_value,
    key_lsn,
    lsn_key,
    pack_lsns,
)
from commitlog.errors import CommitLogError, CorruptRecordError
from commitlog.salvage_read import RawLog, read_raw
from commitlog.wal import Wal, WalConfig

SHORT_GAP = 1024  # a missing run up to this long is listed LSN by LSN; a longer one as [first, last]


@dataclass(slots=True)
class SalvageReport:
    num_copied: int = 0
    lost_lsns: list[int] = field(default_factory=list)  # records that failed their checks, short gaps
    lost_ranges: list[tuple[int, int]] = field(default_factory=list)  # unreadable pages, long gaps
    skipped_keys: list[bytes] = field(default_factory=list)  # keys that are no LSN, or far past the log
    tail_unknown: bool = False  # records after the last lost range could not be counted
    checkpoint_lsn: int = 0  # the closing CHECKPOINT's LSN in the copy: the copy's LSNs go on after it

    @property
    def num_lost(self) -> int:
        return len(self.lost_lsns) + sum(b - a + 1 for a, b in self.lost_ranges)


@dataclass(slots=True)
class _Copy:
    """The copy being built in one pass: re-encoded records, their LSNs, the rebuilt tables."""

    group: EncodedGroup = field(default_factory=lambda: EncodedGroup(0, 0, [], []))
    prev: bytes = GENESIS_HASH
    kept: list[list[int | bytes]] = field(default_factory=list)
    lsns: list[int] = field(default_factory=list)
    live: dict[bytes, bytes] = field(default_factory=dict)
    request_lsns: dict[bytes, list[int]] = field(default_factory=dict)

    def add(self, record: Record) -> None:
        self.kept.append([record.lsn, self.prev])
        value, self.prev = encode_value(record.lsn, Entry(record.kind, record.rid, record.payload), record.ts_ns,
                                        self.prev)
        self.group.records.append((lsn_key(record.lsn), value))
        self.lsns.append(record.lsn)
        if record.rid is not None:
            self._track(record.rid.encode(), record)

    def _track(self, rid: bytes, record: Record) -> None:
        """Rebuild `live` and `by_rid` as the encoder would have. Records of a rid whose BEGIN was
        lost are copied but not indexed: no incarnation of it can be proven."""
        if record.kind is Kind.BEGIN:
            self.request_lsns[rid] = [record.lsn]
            self.live[rid] = lsn_key(record.lsn)
        elif rid in self.request_lsns:
            self.request_lsns[rid].append(record.lsn)
            if record.kind is Kind.FINISH:
                self.live.pop(rid, None)
                self.group.index.append((rid, pack_lsns(self.request_lsns.pop(rid))))


def salvage(log_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> SalvageReport:
    """Copy what reads; refuse (CommitLogError, nothing written) when no record does."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; salvage writes a fresh log")
    raw = read_raw(str(log_dir))
    report, copy = _sort(raw)
    if not copy.lsns:
        why = f" ({raw.open_error})" if raw.open_error else ""
        raise CommitLogError(f"no record of {log_dir} could be read{why}; no log was written to {out}. "
                             "Restore the log directory from a backup")
    _close(report, copy, str(log_dir))
    dst = Wal.open(out, WalConfig())
    try:
        dst.write_group(copy.group)
    finally:
        dst.close()
    report.num_copied = len(copy.lsns)
    return report


def _sort(raw: RawLog) -> tuple[SalvageReport, _Copy]:
    """Decide, key by key, what is copied, what is lost and what is skipped; copy in the same pass."""
    report = SalvageReport(lost_ranges=list(raw.unreadable), tail_unknown=raw.tail_unknown)
    copy = _Copy()
    failed: list[int] = []
    for key, value in raw.pairs:
        if len(key) != 8:
            report.skipped_keys.append(key)
            continue
        try:
            copy.add(decode_value(key, value))
        except CorruptRecordError:
            failed.append(key_lsn(key))
    top = copy.lsns[-1] if copy.lsns else 0
    # A damaged tail holds at most one LSN per failed key past the last intact record; a key beyond
    # that is no record this log ever wrote (it would make LSNs go on from a far-away value).
    reach = top + sum(1 for lsn in failed if lsn > top) + sum(b - a + 1 for a, b in raw.unreadable if a > top)
    report.skipped_keys.extend(lsn_key(lsn) for lsn in failed if lsn > reach)
    report.lost_lsns = sorted(lsn for lsn in failed if lsn <= reach)
    _add_gaps(report, copy.lsns, _dropped_by_retention(raw))
    return report, copy


def _dropped_by_retention(raw: RawLog) -> tuple[int, set[int]]:
    """(start, kept LSNs) of the source's checkpoint: LSNs below start not kept were dropped on purpose."""
    if raw.checkpoint is None:
        return 1, set()
    try:
        cp = decode_value(*raw.checkpoint)
        return int(cp.payload["start"]), {int(lsn) for lsn, _prev in cp.payload["kept"]}
    except (CorruptRecordError, KeyError, TypeError, ValueError):
        return 1, set()  # unreadable: every gap counts as lost


def _add_gaps(report: SalvageReport, copied: list[int], dropped: tuple[int, set[int]]) -> None:
    """LSNs absent from the table (and not explained by retention or an unreadable run) are lost too."""
    cut, kept = dropped
    ranges = sorted(report.lost_ranges)
    present = sorted(set(copied) | set(report.lost_lsns) | {n for a, b in ranges for n in (a, b)})
    expected = 1
    for lsn in present:
        inside = next((b for a, b in ranges if a <= lsn <= b), None) if ranges else None
        if inside is None and lsn > expected:
            _missing(report, expected, lsn - 1, cut, kept)
        expected = max(expected, (inside if inside is not None else lsn) + 1)
    report.lost_lsns.sort()
    report.lost_ranges.sort()


def _missing(report: SalvageReport, first: int, last: int, cut: int, kept: set[int]) -> None:
    below = sorted(lsn for lsn in kept if first <= lsn <= min(last, cut - 1))  # listed kept, now missing
    report.lost_lsns.extend(below)
    first = max(first, cut)
    if first > last:
        return
    if last - first + 1 <= SHORT_GAP:
        report.lost_lsns.extend(range(first, last + 1))
    else:
        report.lost_ranges.append((first, last))


def _close(report: SalvageReport, copy: _Copy, source: str) -> None:
    """Append the closing CHECKPOINT: start after every LSN copied or named lost."""
    group = copy.group
    end = max([copy.lsns[-1], *report.lost_lsns, *(b for _a, b in report.lost_ranges)]) + 1
    payload: dict[str, object] = {"start": end, "anchor": copy.prev, "kept": copy.kept, "dropped_requests": 0,
                                  "salvaged_from": source, "lost": report.lost_lsns}
    if report.lost_ranges:
        payload["lost_ranges"] = [list(r) for r in report.lost_ranges]
    if report.skipped_keys:
        payload["skipped_keys"] = list(report.skipped_keys)
    value, _ = encode_value(end, Entry(Kind.CHECKPOINT, None, payload), time.time_ns(), copy.prev)
    group.records.append((lsn_key(end), value))
    group.meta.append((META_CHECKPOINT, lsn_key(end)))
    group.live_puts = sorted(copy.live.items())
    report.checkpoint_lsn = end
