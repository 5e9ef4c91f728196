"""Keys in the records table that are not 8-byte LSNs (issue 10 C.13): `verify` reports each one,
a restart refuses the log with the salvage command, and no command prints a traceback."""
from __future__ import annotations

from pathlib import Path

import pytest
from logcli_helpers import cli, cli_subprocess, good_request, server, write_log

from commitlog import CorruptRecordError, Kind, Ledger, LogReader, recovery
from commitlog.codec import lsn_key
from commitlog.wal import Durability, Wal, WalConfig
from ops.logcli import checklog

FAST = WalConfig(durability=Durability.NONE)


def _log(log: Path) -> int:
    write_log(log, [[server(Kind.SERVER_START)]] + [good_request(f"r{i}") for i in range(6)]
              + [[server(Kind.SERVER_STOP)]])
    reader = LogReader.open(log)
    try:
        return reader.last_lsn()
    finally:
        reader.close()


def _put_raw(log: Path, keys: list[bytes]) -> None:
    """Put each key with a copy of the last record's value, as a careless tool or an attacker would."""
    wal = Wal.open(log, FAST)
    try:
        with wal.env.begin(write=True) as txn:
            _key, value = next(iter(txn.cursor(wal.records).iterprev()))
            for key in keys:
                txn.put(key, value, db=wal.records)
    finally:
        wal.close()


def test_verify_reports_every_record_key_that_is_not_an_8_byte_lsn(tmp_path: Path) -> None:
    log = tmp_path / "log"
    last = _log(log)
    bad = [lsn_key(last) + b"\x01", lsn_key(5) + b"\xff", b"\x00" * 7]  # after the tail, mid-log, before LSN 1
    _put_raw(log, bad)
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc != 0 and "Traceback" not in ran.err
    body = ran.json()
    keys = [v for v in body["violations"] if v["check"] == "key"]
    assert sorted(v["message"].split("key ")[1].split(" ")[0] for v in keys) == sorted(k.hex() for k in bad)
    assert body["last_lsn"] == last  # the stray key is not taken for a far-away LSN


@pytest.mark.parametrize("jobs", ["1", "4"])
def test_verify_of_a_9_byte_key_appended_at_the_end_fails_whatever_the_range_plan(
        tmp_path: Path, jobs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log"
    last = _log(log)
    _put_raw(log, [lsn_key(last) + b"\x01"])
    monkeypatch.setattr(checklog, "RECORDS_PER_JOB", 4)  # split this small log into ranges, as a big one is
    ran = cli("verify", "--log-dir", log, "--jobs", jobs)
    assert ran.rc != 0 and "Traceback" not in ran.out + ran.err
    assert (lsn_key(last) + b"\x01").hex() in ran.out
    assert cli_subprocess("verify", "--log-dir", log).rc != 0


def test_restart_refuses_a_log_with_a_9_byte_key_and_names_the_salvage_command(tmp_path: Path) -> None:
    log = tmp_path / "log"
    last = _log(log)
    _put_raw(log, [lsn_key(last) + b"\x01"])
    with pytest.raises(CorruptRecordError) as info:
        Ledger.open(log, FAST)
    assert "not an 8-byte LSN" in str(info.value) and f"tokenledger salvage --log-dir {log}" in str(info.value)


def test_restart_refuses_a_stray_key_in_the_middle_of_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log"
    _log(log)
    _put_raw(log, [lsn_key(3) + b"\x00\x00"])
    monkeypatch.setattr(recovery, "TAIL_CHECK_RECORDS", 4)  # far before the tail recovery checks
    with pytest.raises(CorruptRecordError) as info:
        Ledger.open(log, FAST)
    assert (lsn_key(3) + b"\x00\x00").hex() in str(info.value) and "tokenledger salvage" in str(info.value)


def test_readers_refuse_a_stray_key_instead_of_stopping_short(tmp_path: Path) -> None:
    log = tmp_path / "log"
    last = _log(log)
    _put_raw(log, [lsn_key(5) + b"\x01"])
    for command in ("replay", "audit", "export"):
        ran = cli(command, "--log-dir", log)
        assert ran.rc == 2 and "not an 8-byte LSN" in ran.err and "tokenledger salvage" in ran.err, command
    reader = LogReader.open(log)
    try:
        assert reader.last_lsn() == last
    finally:
        reader.close()
