"""`--expect-head` and the hash chain: an edited, inserted or deleted record is a violation (exit 1)."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from logcli_helpers import cli, good_request, server, write_log

from commitlog import Entry, Kind, LogReader
from commitlog.codec import GENESIS_HASH, encode_value, lsn_key
from commitlog.wal import Wal


def _make(log: Path) -> str:
    write_log(log, [[server(Kind.SERVER_START)]] + [good_request(f"r{i}") for i in range(6)])
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 0
    body = ran.json()
    return f"{body['head_lsn']}:{body['head']}"


def _entries(log: Path) -> list[tuple[int, int, Entry]]:
    reader = LogReader.open(log)
    try:
        return [(r.lsn, r.ts_ns, Entry(r.kind, r.rid, r.payload)) for r in reader.records()]
    finally:
        reader.close()


def _rewrite(log: Path, edit: Callable[[list[tuple[int, int, Entry]]], list[tuple[int, int, Entry]]],
             rechain: bool = True) -> None:
    """Replace the records table with `edit(records)`: CRCs always valid, the chain recomputed or not."""
    old = {lsn: value for lsn, value in _raw(log)}
    records = edit(_entries(log))
    wal = Wal.open(log)
    prev = GENESIS_HASH
    with wal.env.begin(write=True) as txn:
        txn.drop(wal.records, delete=False)
        for lsn, ts, entry in records:
            value, chain_hash = encode_value(lsn, entry, ts, prev)
            if not rechain and lsn in old:
                value = value[:6] + old[lsn][6:38] + value[38:]  # keep the old chain hash, fix the CRC
                value = _fix_crc(value)
            txn.put(lsn_key(lsn), value, db=wal.records)
            prev = chain_hash if rechain else value[6:38]
    wal.close()


def _raw(log: Path) -> list[tuple[int, bytes]]:
    reader = LogReader.open(log)
    with reader.wal.env.begin() as txn:
        out = [(int.from_bytes(k, "big"), bytes(v)) for k, v in txn.cursor(reader.wal.records)]
    reader.close()
    return out


def _fix_crc(value: bytes) -> bytes:
    import struct
    import zlib

    crc = zlib.crc32(value[38:], zlib.crc32(value[6:38], zlib.crc32(value[:2])))
    return value[:2] + struct.pack(">I", crc) + value[6:]


def _edit_commit(records: list[tuple[int, int, Entry]]) -> list[tuple[int, int, Entry]]:
    lsn, ts, entry = records[7]  # LSN 8: a COMMIT of r1
    assert entry.kind is Kind.COMMIT
    entry.payload["ids"] = [777]
    return records


def _violations(log: Path, head: str) -> list[dict]:
    ran = cli("verify", "--log-dir", log, "--json", "--expect-head", head)
    assert ran.rc == 1, ran.out
    return ran.json()["violations"]


def test_log_that_grew_after_publication_still_matches_its_head(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)
    from commitlog import Encoder

    last = _entries(log)
    reader = LogReader.open(log)
    tail_hash = reader.verify().tail_hash
    reader.close()
    write_log(log, [good_request("late")], Encoder(last[-1][0] + 1, tail_hash))
    assert cli("verify", "--log-dir", log, "--expect-head", head).rc == 0
    assert cli("verify", "--log-dir", log, "--expect-head", head.split(":")[1]).rc == 0


def test_edit_with_the_chain_recomputed_is_caught_only_by_the_published_head(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)
    _rewrite(log, _edit_commit)
    assert cli("verify", "--log-dir", log).rc == 0  # internally consistent: only the head can tell
    (v,) = _violations(log, head)
    assert v["check"] == "head" and f"at or before LSN {head.split(':')[0]}" in v["message"]
    (v,) = _violations(log, head.split(":")[1])
    assert v["check"] == "head" and "not in the hash chain" in v["message"]


def test_edit_without_rechaining_names_the_edited_lsn(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)
    _rewrite(log, _edit_commit, rechain=False)
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 1
    (v,) = ran.json()["violations"]
    assert (v["lsn"], v["check"]) == (8, "chain") and "edited" in v["message"]
    assert [x["lsn"] for x in _violations(log, head) if x["check"] == "chain"] == [8]


def test_deleted_record_in_the_middle_is_an_lsn_gap(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)
    _rewrite(log, lambda recs: [r for r in recs if r[0] != 9], rechain=False)
    lsns = [v["lsn"] for v in _violations(log, head) if v["check"] == "chain"]
    assert lsns == [10]


def test_records_removed_from_the_end_fail_the_published_head(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)
    _rewrite(log, lambda recs: recs[:-3])
    (v,) = [x for x in _violations(log, head) if x["check"] == "head"]
    assert "removed from the end" in v["message"]
    assert [x["check"] for x in _violations(log, head) if x["check"] != "head"] == ["index"]  # r5's entry too


def test_inserted_record_with_renumbering_fails_the_published_head(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)

    def insert(recs: list[tuple[int, int, Entry]]) -> list[tuple[int, int, Entry]]:
        extra = (0, recs[4][1], Entry(Kind.DISCARD, recs[4][2].rid, {"reason": "forged"}))
        shifted = recs[:5] + [extra] + recs[5:]
        return [(i + 1, ts, e) for i, (_, ts, e) in enumerate(shifted)]

    _rewrite(log, insert)
    (v,) = [x for x in _violations(log, head) if x["check"] == "head"]  # the stale index is reported as well
    assert re.search(r"LSN \d+ was edited, inserted or removed|at or before", v["message"])


def _forge_checkpoint_over_an_edit(log: Path) -> None:
    """Edit COMMIT LSN 8 (its own hash recomputed from LSN 7's), then append a CHECKPOINT listing every
    record with the predecessor hash each was chained from, so every per-record check passes."""
    from commitlog.codec import META_CHECKPOINT, chain

    raw = dict(_raw(log))
    last = max(raw)
    (lsn, ts, entry) = _entries(log)[7]
    entry.payload["ids"] = [777]
    edited, _ = encode_value(lsn, entry, ts, raw[7][6:38])
    originals = {n: bytes(v[6:38]) for n, v in raw.items()}
    kept = [[n, originals.get(n - 1, GENESIS_HASH)] for n in sorted(raw)]
    anchor = originals[last]
    assert chain(kept[8][1], raw[9][38:]) == originals[9]  # LSN 9 listed with the hash it was chained from
    closing = Entry(Kind.CHECKPOINT, None, {"start": last + 1, "anchor": anchor, "kept": kept, "dropped_requests": 0})
    value, _ = encode_value(last + 1, closing, ts, anchor)
    wal = Wal.open(log)
    with wal.env.begin(write=True) as txn:
        txn.put(lsn_key(8), edited, db=wal.records)
        txn.put(lsn_key(last + 1), value, db=wal.records)
        txn.put(META_CHECKPOINT, lsn_key(last + 1), db=wal.meta)
    wal.close()


def test_verify_rejects_forged_checkpoint_predecessor_hash(tmp_path: Path) -> None:
    log = tmp_path / "log"
    head = _make(log)
    _forge_checkpoint_over_an_edit(log)
    for published in (head, head.split(":")[1]):
        ran = cli("verify", "--log-dir", log, "--json", "--expect-head", published)
        assert ran.rc == 1, ran.out
        chain_breaks = [v for v in ran.json()["violations"] if v["check"] == "chain"]
        assert [v["lsn"] for v in chain_breaks] == [9] and "predecessor" in chain_breaks[0]["message"]
    assert cli("verify", "--log-dir", log).rc == 1  # the forgery is visible without a published head too


def test_log_reader_verify_rejects_forged_checkpoint_predecessor_hash(tmp_path: Path) -> None:
    import pytest

    from commitlog import CorruptRecordError

    log = tmp_path / "log"
    _make(log)
    _forge_checkpoint_over_an_edit(log)
    reader = LogReader.open(log)
    try:
        with pytest.raises(CorruptRecordError) as info:
            reader.verify()
    finally:
        reader.close()
    assert info.value.lsn == 9 and "predecessor" in str(info.value)
