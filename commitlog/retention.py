"""Retention: drop whole finished requests before a cut LSN, checkpoint the chain, compact.

Records at or after the cut are all kept. Below it, records of requests that had not finished
before the cut are kept too, and the CHECKPOINT lists each of them with its predecessor's
hash, so the whole kept log still verifies (FORMAT.md, "Retention").
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from commitlog.codec import Entry, Kind, Record, lsn_key
from commitlog.errors import CommitLogError
from commitlog.ledger import Ledger
from commitlog.reader import LogReader


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    max_age_s: float | None = None  # drop finished requests whose records are all older
    max_bytes: int | None = None  # ... or that lie before the newest max_bytes of record values

    def __post_init__(self) -> None:
        if self.max_age_s is None and self.max_bytes is None:
            raise ValueError("a retention policy needs max_age_s or max_bytes")
        if (self.max_age_s is not None and self.max_age_s < 0) or (self.max_bytes is not None and self.max_bytes < 0):
            raise ValueError("max_age_s and max_bytes must be >= 0")


@dataclass(slots=True)
class RetentionPlan:
    cut: int
    anchor: bytes
    kept: list[list[int | bytes]] = field(default_factory=list)  # [lsn, predecessor hash]
    deletes: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    dropped_requests: list[str] = field(default_factory=list)


def plan_retention(reader: LogReader, policy: RetentionPolicy, live: set[str], now_ns: int) -> RetentionPlan | None:
    """Decide what to drop; None when nothing would be. Reads the whole log once.

    `live` (the ledger's running rids) needs no test of its own: a running incarnation has no FINISH."""
    records = list(reader.records())
    if not records:
        return None
    old = reader.checkpoint()
    old_cut = 1 if old is None else int(old.payload["start"])
    cut = max(_cut_for(records, policy, now_ns), old_cut)
    droppable, dropped = _finished_before(records, cut)
    hashes = {r.lsn: r.chain_hash for r in records}
    old_prev = {} if old is None else {int(lsn): prev for lsn, prev in old.payload["kept"]}
    anchor = hashes.get(cut - 1) or (old.payload["anchor"] if old is not None else b"")
    plan = RetentionPlan(cut, anchor, dropped_requests=sorted(dropped))
    for r in records:
        if r.lsn >= cut:
            break
        if r.rid is None or r.lsn in droppable:
            plan.deletes.append((lsn_key(r.lsn), None if r.rid is None else r.rid.encode()))
        else:
            plan.kept.append([r.lsn, hashes.get(r.lsn - 1) or old_prev[r.lsn]])
    return plan if plan.deletes else None


def _finished_before(records: list[Record], cut: int) -> tuple[set[int], list[str]]:
    """LSNs of every incarnation whose FINISH is below the cut, and their rids (once per incarnation).

    Per incarnation, not per rid: a rid used again may have a finished incarnation below the cut and
    a later one still running there (issue 10 C.14); the later one is kept whole. A request live in
    the ledger has no FINISH in the log, so it is never dropped."""
    current: dict[str, list[int]] = {}
    droppable: set[int] = set()
    dropped: list[str] = []
    for r in records:
        if r.lsn >= cut:
            break
        if r.rid is None:
            continue
        if r.kind is Kind.BEGIN:
            current[r.rid] = [r.lsn]
            continue
        current.setdefault(r.rid, []).append(r.lsn)
        if r.kind is Kind.FINISH:
            droppable.update(current.pop(r.rid))
            dropped.append(r.rid)
    return droppable, dropped


def _cut_for(records: list[Record], policy: RetentionPolicy, now_ns: int) -> int:
    cut = records[0].lsn
    if policy.max_age_s is not None:
        limit = now_ns - int(policy.max_age_s * 1e9)
        cut = next((r.lsn for r in records if r.ts_ns >= limit), records[-1].lsn + 1)
    if policy.max_bytes is not None:
        total = 0
        for r in reversed(records):
            total += len(r.body) + 65  # header + chain hash + key, roughly
            if total > policy.max_bytes:
                cut = max(cut, r.lsn + 1)
                break
    return cut


def apply_retention(ledger: Ledger, policy: RetentionPolicy, now_ns: int | None = None) -> RetentionPlan | None:
    """Plan on the writer thread, then log one CHECKPOINT and the deletes as one group."""
    now = time.time_ns() if now_ns is None else now_ns
    live = set(ledger.live)
    plan = ledger.read(lambda reader: plan_retention(reader, policy, live, now))
    if plan is None:
        return None
    ledger.stage_retention(Entry(Kind.CHECKPOINT, None, {
        "start": plan.cut, "anchor": plan.anchor, "kept": plan.kept,
        "dropped_requests": len(plan.dropped_requests)}), plan.deletes)
    ledger.flush()
    return plan


def compact(log_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> None:
    """Write a compacted snapshot of the log (free pages dropped) to an empty `out_dir`."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; compact writes a fresh copy")
    out.mkdir(parents=True, exist_ok=True)
    reader = LogReader.open(log_dir)
    try:
        reader.wal.env.copy(str(out), compact=True)
    except lmdb.Error as exc:
        raise CommitLogError(f"compacting {log_dir} into {out} failed: {exc}") from None
    finally:
        reader.close()
