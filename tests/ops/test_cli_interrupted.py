"""Requests a crash left open: reported (not a failure) before and after recovery (I7)."""
from __future__ import annotations

from pathlib import Path

from logcli_helpers import cli

from commitlog import Durability, FinishReason, Ledger, WalConfig

FAST = WalConfig(durability=Durability.NONE)


def _crashed_log(log: Path) -> None:
    ledger = Ledger.open(log, FAST)
    ledger.begin("done", [1, 2], {"max_new_tokens": 1})
    txn = ledger.txn("done")
    txn.append_token(7, -0.1)
    txn.advance_watermark(3)
    txn.set_finish(FinishReason.LENGTH, 1)
    txn.commit()
    ledger.begin("open", [1, 2, 3], {"max_new_tokens": 9})
    txn = ledger.txn("open")
    txn.append_token(8, -0.2)
    txn.commit()
    ledger.writer.wait_durable(ledger.flush(), timeout=10)
    ledger.writer.close()  # a crash: no FINISH for "open", no SERVER_STOP
    ledger.wal.close()


def test_unrecovered_crash_reports_the_open_request_as_interrupted(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _crashed_log(log)
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 0, ran.out
    assert ran.json()["unrecovered"] == ["open"]
    (audit,) = cli("audit", "--log-dir", log, "--rid", "open", "--json").json_lines()
    assert audit["status"] == "interrupted" and audit["finish_logged"] is False and audit["output_ids"] == [8]


def test_after_recovery_the_request_is_finished_interrupted_and_verify_passes(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _crashed_log(log)
    Ledger.open(log, FAST).close()  # recovery: FINISH(interrupted), RECOVERED, SERVER_START; then SERVER_STOP
    running = cli("audit", "--log-dir", log, "--rid", "open", "--json").json_lines()
    assert running[0]["status"] == "interrupted" and running[0]["finish_reason"] == {"type": "interrupted"}
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 0 and ran.json()["interrupted"] == ["open"] and ran.json()["requests"]["interrupted"] == 1
    by_status = {a["rid"]: a["status"] for a in cli("audit", "--log-dir", log, "--json").json_lines()}
    assert by_status == {"done": "finished", "open": "interrupted"}
    assert "interrupted" in cli("verify", "--log-dir", log).out
