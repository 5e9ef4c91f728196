"""Salvage: copy every intact record of a damaged log into a fresh log that verifies.

Intact records keep their LSNs and bodies; the chain is recomputed over them and a closing
CHECKPOINT lists each one (FORMAT.md, "Salvage"), naming the LSNs that were lost.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

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
from commitlog.wal import Wal, WalConfig


@dataclass(slots=True)
class SalvageReport:
    num_copied: int = 0
    lost_lsns: list[int] = field(default_factory=list)


def salvage(log_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> SalvageReport:
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; salvage writes a fresh log")
    src = Wal.open(log_dir, readonly=True)
    dst = Wal.open(out, WalConfig())
    try:
        return _copy(src, dst)
    except lmdb.Error as exc:
        raise CommitLogError(f"salvage of {log_dir} stopped at an unreadable page: {exc}") from None
    finally:
        src.close()
        dst.close()


def _copy(src: Wal, dst: Wal) -> SalvageReport:
    report = SalvageReport()
    group = EncodedGroup(0, 0, [], [])
    prev, kept, last, expected = GENESIS_HASH, [], 0, 1
    live: dict[bytes, bytes] = {}
    lsns: dict[bytes, list[int]] = {}
    with src.env.begin() as txn, txn.cursor(src.records) as cur:
        for key, value in cur:
            lsn = key_lsn(key)
            report.lost_lsns.extend(range(expected, lsn))
            expected, last = lsn + 1, max(last, lsn)
            try:
                record = decode_value(key, value)
            except CorruptRecordError:
                report.lost_lsns.append(lsn)
                continue
            entry = Entry(record.kind, record.rid, record.payload)
            kept.append([lsn, prev])
            new_value, prev = encode_value(lsn, entry, record.ts_ns, prev)
            group.records.append((key, new_value))
            if record.rid is not None:
                _track(group, live, lsns, record)
    end = last + 1
    closing = Entry(Kind.CHECKPOINT, None, {"start": end, "anchor": prev, "kept": kept, "dropped_requests": 0,
                                           "salvaged_from": str(src.log_dir), "lost": report.lost_lsns})
    value, _ = encode_value(end, closing, time.time_ns(), prev)
    group.records.append((lsn_key(end), value))
    group.meta.append((META_CHECKPOINT, lsn_key(end)))
    group.live_puts = sorted(live.items())
    dst.write_group(group)
    report.num_copied = len(kept)
    return report



def _track(group: EncodedGroup, live: dict[bytes, bytes], lsns: dict[bytes, list[int]], record: Record) -> None:
    """Rebuild the live table and the per-request index as the encoder would have."""
    assert record.rid is not None
    rid = record.rid.encode()
    lsns.setdefault(rid, []).append(record.lsn)
    if record.kind is Kind.BEGIN:
        live[rid] = lsn_key(record.lsn)
    elif record.kind is Kind.FINISH:
        live.pop(rid, None)
        group.index.append((rid, pack_lsns(lsns.pop(rid))))
