"""Recovery on open: interrupted requests are finished once (I7), LSNs continue, corrupt tails refuse."""
from __future__ import annotations

from pathlib import Path

import pytest
from commitlog_helpers import FAST, crash, sync_flush

from commitlog import CorruptRecordError, FinishReason, Kind, Ledger, LogReader, salvage


def _crashed_log_with_two_running_requests(log_dir: Path) -> None:
    ledger = Ledger.open(log_dir, FAST)
    for rid in ("a", "b", "done"):
        ledger.begin(rid, [1, 2], {})
    txn = ledger.txn("a")
    txn.append_token(9, -0.3)
    txn.advance_watermark(3)
    txn.commit()
    ledger.finish("done", FinishReason.STOP)
    sync_flush(ledger)
    crash(ledger)


def _finishes(reader: LogReader) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for record in reader.records():
        if record.kind is Kind.FINISH:
            out.setdefault(record.rid or "", []).append(record.payload["reason"])
    return out


def test_i7_open_after_a_crash_finishes_each_begun_request_as_interrupted_once(log_dir: Path) -> None:
    _crashed_log_with_two_running_requests(log_dir)
    ledger = Ledger.open(log_dir, FAST)
    assert ledger.recovery.interrupted == ["a", "b"] and not ledger.recovery.was_clean
    ledger.close()
    ledger = Ledger.open(log_dir, FAST)  # a clean restart recovers nothing more
    assert ledger.recovery.was_clean and ledger.recovery.interrupted == []
    ledger.close()
    reader = LogReader.open(log_dir)
    assert _finishes(reader) == {"done": ["stop"], "a": ["interrupted"], "b": ["interrupted"]}
    kinds = [r.kind for r in reader.records()]
    assert kinds.count(Kind.RECOVERED) == 1
    a = reader.rebuild("a")
    assert a.output_ids == [9] and a.finish_reason is FinishReason.INTERRUPTED
    finish = [r for r in reader.request_records("a") if r.kind is Kind.FINISH][0]
    assert finish.payload["n_out"] == 1 and finish.payload["kv"] == 3
    reader.verify()
    reader.close()


def test_lsns_are_never_reused_across_restarts(log_dir: Path) -> None:
    _crashed_log_with_two_running_requests(log_dir)
    before = LogReader.open(log_dir)
    last = before.last_lsn()
    before.close()
    ledger = Ledger.open(log_dir, FAST)
    first_new = ledger.read(lambda r: [x.lsn for x in r.records(last + 1)])
    ledger.close()
    assert first_new[0] == last + 1
    assert LogReader.open(log_dir).verify().last_lsn == first_new[-1] + 1  # + SERVER_STOP


def _flip_in_data_file(log_dir: Path, value: bytes, offset: int) -> None:
    data = bytearray((log_dir / "data.mdb").read_bytes())
    at = data.find(value)
    assert at >= 0
    while at >= 0:  # copy-on-write leaves stale copies in free pages; flip every copy
        data[at + offset] ^= 0xFF
        at = data.find(value, at + 1)
    (log_dir / "data.mdb").write_bytes(bytes(data))


def test_corrupt_tail_refuses_to_open_for_writing_and_names_the_salvage_command(log_dir: Path) -> None:
    _crashed_log_with_two_running_requests(log_dir)
    reader = LogReader.open(log_dir)
    last = list(reader.records())[-1]
    value = reader.wal.env.begin().get(last.lsn.to_bytes(8, "big"), db=reader.wal.records)
    reader.close()
    _flip_in_data_file(log_dir, value, len(value) - 3)
    with pytest.raises(CorruptRecordError) as info:
        Ledger.open(log_dir, FAST)
    assert info.value.lsn == last.lsn and f"LSN {last.lsn}" in str(info.value)
    assert f"tokenledger salvage --log-dir {log_dir}" in str(info.value)
    Ledger.open(log_dir.parent / "other", FAST).close()  # the failed open released its lock


def test_salvage_copies_intact_records_into_a_log_that_verifies_and_reopens(log_dir: Path) -> None:
    _crashed_log_with_two_running_requests(log_dir)
    reader = LogReader.open(log_dir)
    records = list(reader.records())
    victim = records[2]
    assert (victim.kind, victim.rid) == (Kind.BEGIN, "b")
    value = reader.wal.env.begin().get(victim.lsn.to_bytes(8, "big"), db=reader.wal.records)
    reader.close()
    _flip_in_data_file(log_dir, value, 40)
    out = log_dir.parent / "salvaged"
    report = salvage(log_dir, out)
    assert report.lost_lsns == [victim.lsn] and report.num_copied == len(records) - 1
    copy = LogReader.open(out)
    copy.verify()
    assert copy.rebuild("a").output_ids == [9]
    copy.close()
    ledger = Ledger.open(out, FAST)  # the server can run on the copy
    assert ledger.recovery.interrupted == ["a"]  # "b" lost its BEGIN with the corrupt record
    ledger.close()
    LogReader.open(out).verify()
