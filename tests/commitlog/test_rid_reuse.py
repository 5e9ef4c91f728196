"""A finished request's rid may be used again (issue 10 C.14): every incarnation stays findable in the
index, in the reader, in `audit --rid` and through retention; none overwrites another."""
from __future__ import annotations

import sys
from pathlib import Path

from commitlog_helpers import FAST, crash, sync_flush

from commitlog import FinishReason, Kind, Ledger, LogReader, RetentionPolicy, apply_retention
from commitlog.audit import audit_incarnations, audit_request

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from logcli_helpers import cli  # noqa: E402


def _incarnation(ledger: Ledger, rid: str, tokens: list[int], finish: bool = True) -> None:
    ledger.begin(rid, [1, 2, 3], {"max_new_tokens": len(tokens)})
    for token in tokens:
        txn = ledger.txn(rid)
        txn.append_token(token, -0.25)
        txn.commit()
    if finish:
        ledger.finish(rid, FinishReason.LENGTH, len(tokens))
    sync_flush(ledger)


def test_reusing_a_finished_rid_keeps_the_earlier_incarnation_auditable(log_dir: Path) -> None:
    ledger = Ledger.open(log_dir, FAST)
    _incarnation(ledger, "a", [7])
    _incarnation(ledger, "other", [1, 1])
    _incarnation(ledger, "a", [8, 9])
    ledger.close()
    reader = LogReader.open(log_dir)
    try:
        records = reader.request_records("a")
        assert [r.kind for r in records].count(Kind.BEGIN) == 2
        audits = audit_incarnations(records)
        assert [a.output_ids for a in audits] == [[7], [8, 9]] and [a.incarnation for a in audits] == [1, 2]
        latest = audit_request(reader, "a")
        assert latest is not None and latest["output_ids"] == [8, 9] and latest["incarnation"] == 2
        first = audit_request(reader, "a", incarnation=1)
        assert first is not None and first["output_ids"] == [7]
    finally:
        reader.close()
    lines = cli("audit", "--log-dir", log_dir, "--rid", "a", "--json").json_lines()
    assert [line["output_ids"] for line in lines] == [[7], [8, 9]]
    whole = [line for line in cli("audit", "--log-dir", log_dir, "--json").json_lines() if line["rid"] == "a"]
    assert whole == lines  # one account whether asked by rid or for the whole log
    assert cli("verify", "--log-dir", log_dir).rc == 0


def test_a_running_reuse_after_a_crash_is_found_beside_the_finished_one(log_dir: Path) -> None:
    ledger = Ledger.open(log_dir, FAST)
    _incarnation(ledger, "a", [7])
    _incarnation(ledger, "a", [8], finish=False)
    crash(ledger)
    reader = LogReader.open(log_dir)
    try:
        audits = audit_incarnations(reader.request_records("a"), writer_alive=False)
        assert [(a.output_ids, a.status) for a in audits] == [([7], "finished"), ([8], "interrupted")]
    finally:
        reader.close()
    ledger = Ledger.open(log_dir, FAST)
    assert ledger.recovery.interrupted == ["a"]
    ledger.close()
    reader = LogReader.open(log_dir)
    try:
        audits = audit_incarnations(reader.request_records("a"))
        assert [(a.output_ids, a.status) for a in audits] == [([7], "finished"), ([8], "interrupted")]
    finally:
        reader.close()


def test_retention_drops_a_finished_incarnation_but_keeps_a_later_one_of_the_same_rid(ledger: Ledger) -> None:
    _incarnation(ledger, "a", [7])
    _incarnation(ledger, "a", [8], finish=False)  # the second one begins before the cut ...
    cut_ts = ledger.read(lambda r: max(rec.ts_ns for rec in r.records())) + 1
    txn = ledger.txn("a")
    txn.append_token(9, -0.25)
    txn.commit()
    ledger.finish("a", FinishReason.LENGTH, 2)
    sync_flush(ledger)  # ... and finishes after it
    plan = apply_retention(ledger, RetentionPolicy(max_age_s=1.0), now_ns=cut_ts + 1_000_000_000)
    sync_flush(ledger)
    assert plan is not None
    audits = ledger.read(lambda r: audit_incarnations(r.request_records("a")))
    assert [a.output_ids for a in audits] == [[8, 9]]
    assert ledger.read(lambda r: r.verify()).checkpoint_lsn is not None
