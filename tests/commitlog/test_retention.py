"""Retention drops whole finished requests only, keeps the chain verifiable, and compacts."""
from __future__ import annotations

from pathlib import Path

import pytest
from commitlog_helpers import sync_flush

from commitlog import (
    CorruptRecordError,
    FinishReason,
    Kind,
    Ledger,
    LogReader,
    RetentionPolicy,
    apply_retention,
    compact,
)


def _request(ledger: Ledger, rid: str, tokens: int, finish: bool = True) -> None:
    ledger.begin(rid, [1, 2, 3], {})
    for i in range(tokens):
        txn = ledger.txn(rid)
        txn.append_token(i, -0.5)
        txn.commit()
    if finish:
        ledger.finish(rid, FinishReason.LENGTH)
    sync_flush(ledger)


def test_retention_drops_whole_finished_requests_never_a_running_one(ledger: Ledger) -> None:
    _request(ledger, "old-done", 5)
    _request(ledger, "running", 2, finish=False)  # began before the cut, still running
    _request(ledger, "old-done-2", 5)
    running_before = ledger.read(lambda r: r.rebuild("running"))
    plan = apply_retention(ledger, RetentionPolicy(max_age_s=0))
    sync_flush(ledger)
    assert plan is not None and plan.dropped_requests == ["old-done", "old-done-2"]
    ids = ledger.read(lambda r: sorted(r.request_ids()))
    assert ids == ["running"]
    assert ledger.read(lambda r: r.rebuild("running")) == running_before
    txn = ledger.txn("running")  # the kept request goes on as before
    txn.append_token(99, -0.1)
    txn.commit()
    _request(ledger, "new", 1)
    report = ledger.read(lambda r: r.verify())
    assert report.checkpoint_lsn is not None
    assert ledger.read(lambda r: r.rebuild("running")).output_ids == [0, 1, 99]


def test_a_second_retention_keeps_the_chain_verifiable(ledger: Ledger) -> None:
    _request(ledger, "a", 3)
    _request(ledger, "run", 1, finish=False)
    apply_retention(ledger, RetentionPolicy(max_age_s=0))
    _request(ledger, "b", 3)
    ledger.finish("run", FinishReason.STOP)
    sync_flush(ledger)
    apply_retention(ledger, RetentionPolicy(max_age_s=0))
    sync_flush(ledger)
    assert ledger.read(lambda r: r.request_ids()) == []
    ledger.read(lambda r: r.verify())


def test_size_cap_drops_the_oldest_finished_requests(ledger: Ledger) -> None:
    for i in range(20):
        _request(ledger, f"r{i:02d}", 10)
    plan = apply_retention(ledger, RetentionPolicy(max_bytes=4000))
    sync_flush(ledger)
    assert plan is not None and "r00" in plan.dropped_requests and "r19" not in plan.dropped_requests
    assert ledger.read(lambda r: r.rebuild("r19")).output_ids == list(range(10))
    ledger.read(lambda r: r.verify())


def test_removing_a_kept_record_below_the_checkpoint_is_detected(ledger: Ledger) -> None:
    _request(ledger, "done", 2)
    _request(ledger, "run", 2, finish=False)
    _request(ledger, "done2", 2)
    plan = apply_retention(ledger, RetentionPolicy(max_age_s=0))
    sync_flush(ledger)
    assert plan is not None
    victim = plan.kept[0][0]

    def delete(reader):
        with reader.wal.env.begin(write=True) as txn:
            txn.delete(int(victim).to_bytes(8, "big"), db=reader.wal.records)
        reader.verify()
    with pytest.raises(CorruptRecordError, match=f"LSN {victim}"):
        ledger.read(delete)


def test_compact_writes_a_smaller_copy_that_verifies(log_dir: Path, tmp_path: Path) -> None:
    ledger = Ledger.open(log_dir)
    for i in range(30):
        _request(ledger, f"r{i}", 20)
    apply_retention(ledger, RetentionPolicy(max_age_s=0))
    ledger.close()
    out = tmp_path / "compacted"
    compact(log_dir, out)
    assert (out / "data.mdb").stat().st_size < (log_dir / "data.mdb").stat().st_size
    reader = LogReader.open(out)
    assert reader.verify().num_records == len(list(LogReader.open(log_dir).records()))
    assert [r.kind for r in reader.records()][-1] is Kind.SERVER_STOP
    with pytest.raises(ValueError):
        compact(log_dir, out)
