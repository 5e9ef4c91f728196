"""The per-request index (`by_rid`) and the `live` table are outside the hash chain (issue 10 C.12):
`verify` cross-checks both against the records, readers never show what the records do not prove,
and a restart refuses a `live` table the records contradict, naming the salvage command."""
from __future__ import annotations

from pathlib import Path

import pytest
from logcli_helpers import abort, begin, cli, cli_subprocess, commit, discard, finish, good_request, server, write_log

from commitlog import CorruptRecordError, Kind, Ledger, LogReader
from commitlog.audit import audit_request
from commitlog.codec import lsn_key, pack_lsns, unpack_lsns
from commitlog.wal import Durability, Wal, WalConfig

FAST = WalConfig(durability=Durability.NONE)


def _victim() -> list:
    """37 tokens over 37 COMMITs, then an abort the client saw: ABORT_REQUESTED, DISCARD, FINISH abort."""
    entries = [begin("victim")] + [commit("victim", [100 + i], wm=4 + i) for i in range(37)]
    return entries + [abort("victim"), discard("victim"), finish("victim", "abort", 37, 40)]


def _log(log: Path) -> None:
    write_log(log, [[server(Kind.SERVER_START)], good_request("before"), _victim(), good_request("after"),
                    [server(Kind.SERVER_STOP)]])


def _tables(log: Path) -> tuple[dict[bytes, bytes], dict[bytes, bytes]]:
    reader = LogReader.open(log)
    try:
        with reader.wal.env.begin() as txn:
            return dict(txn.cursor(reader.wal.index)), dict(txn.cursor(reader.wal.live))
    finally:
        reader.close()


def _put(log: Path, db: str, key: bytes, value: bytes | None) -> None:
    wal = Wal.open(log, FAST)
    try:
        with wal.env.begin(write=True) as txn:
            table = wal.index if db == "index" else wal.live
            if value is None:
                txn.delete(key, db=table)
            else:
                txn.put(key, value, db=table)
    finally:
        wal.close()


def _hide_the_abort(log: Path) -> None:
    """Rewrite the victim's index entry to its BEGIN, first COMMIT and FINISH only."""
    index, _ = _tables(log)
    lsns = unpack_lsns(index[b"victim"])
    _put(log, "index", b"victim", pack_lsns([lsns[0], lsns[1], lsns[-1]]))


def _violations(log: Path, check: str) -> list[dict]:
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 1, ran.out
    return [v for v in ran.json()["violations"] if v["check"] == check]


def test_verify_rejects_a_rewritten_index_entry(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    assert cli("verify", "--log-dir", log).rc == 0
    _hide_the_abort(log)
    (v,) = _violations(log, "index")
    assert v["rid"] == "victim" and "index" in v["message"]


def test_readers_refuse_a_rewritten_index_instead_of_showing_one_token(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    _hide_the_abort(log)
    reader = LogReader.open(log)
    try:
        with pytest.raises(CorruptRecordError) as info:
            audit_request(reader, "victim")  # what GET /requests/{rid} shows
        assert "index" in str(info.value)
        assert audit_request(reader, "after")["completion_tokens"] == 3  # other requests still read
    finally:
        reader.close()
    for command in ("audit", "replay"):
        ran = cli_subprocess(command, "--log-dir", log, "--rid", "victim")
        assert ran.rc == 2 and "Traceback" not in ran.err and "tokenledger salvage" in ran.err, (command, ran)
        assert "completion" not in ran.out


def test_verify_rejects_an_index_entry_for_a_request_with_no_records(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    _put(log, "index", b"phantom", pack_lsns([2, 3]))
    (v,) = _violations(log, "index")
    assert v["rid"] == "phantom"


def test_verify_rejects_a_missing_index_entry(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    _put(log, "index", b"before", None)
    (v,) = _violations(log, "index")
    assert v["rid"] == "before" and "no index entry" in v["message"]


def test_verify_rejects_a_live_entry_without_a_begin(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    _put(log, "live", b"ghost", lsn_key(3))  # LSN 3 is a COMMIT of `before`
    (v,) = _violations(log, "live")
    assert v["rid"] == "ghost"


def test_verify_rejects_a_running_request_missing_from_live(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, [[server(Kind.SERVER_START)], [begin("run"), commit("run", [5], wm=4)]])  # a crash
    assert cli("verify", "--log-dir", log).rc == 0
    _put(log, "live", b"run", None)
    (v,) = _violations(log, "live")
    assert v["rid"] == "run" and "missing" in v["message"]


def test_restart_refuses_a_live_entry_without_a_begin_with_the_salvage_command(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    _put(log, "live", b"ghost", lsn_key(3))
    with pytest.raises(CorruptRecordError) as info:
        Ledger.open(log, FAST)
    assert "ghost" in str(info.value) and f"tokenledger salvage --log-dir {log}" in str(info.value)
    _put(log, "live", b"ghost", lsn_key(999))  # past the end of the log
    with pytest.raises(CorruptRecordError):
        Ledger.open(log, FAST)


def test_salvage_rebuilds_both_tables_from_the_records(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log)
    _hide_the_abort(log)
    _put(log, "live", b"ghost", lsn_key(3))
    assert cli("salvage", "--log-dir", log, "--out", tmp_path / "out").rc == 0
    assert cli("verify", "--log-dir", tmp_path / "out").rc == 0
    reader = LogReader.open(tmp_path / "out")
    try:
        audit = audit_request(reader, "victim")
        assert audit is not None and audit["completion_tokens"] == 37 and audit["abort_source"] == "api"
    finally:
        reader.close()
