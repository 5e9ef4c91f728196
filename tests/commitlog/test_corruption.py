"""Damaged files: flipped bytes and truncation give CorruptRecordError, never wrong data or a crash."""
from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
from commitlog_helpers import FAST, damage_index_pages

from commitlog import CommitLogError, CorruptRecordError, FinishReason, Ledger, LogReader, salvage


def _write_log(log_dir: Path, num_requests: int = 30) -> dict[int, bytes]:
    ledger = Ledger.open(log_dir, FAST)
    for r in range(num_requests):
        ledger.begin(f"req-{r}", [r, r + 1, r + 2], {"temperature": 0.5})
        for i in range(3):
            txn = ledger.txn(f"req-{r}")
            txn.append_token(1000 * r + i, -0.01 * i, [(1000 * r + i, -0.01 * i), (7, -4.0)])
            txn.commit()
        ledger.finish(f"req-{r}", FinishReason.LENGTH)
        ledger.flush()
    ledger.close()
    reader = LogReader.open(log_dir)
    with reader.wal.env.begin() as txn:
        values = {int.from_bytes(k, "big"): v for k, v in txn.cursor(reader.wal.records)}
    reader.close()
    return values


@pytest.mark.parametrize("seed", range(6))
def test_flipped_byte_in_a_record_value_on_disk_is_reported_with_its_lsn(log_dir: Path, seed: int) -> None:
    values = _write_log(log_dir)
    rng = random.Random(seed)
    lsn = rng.choice(sorted(values))
    value = values[lsn]
    offset, mask = rng.randrange(len(value)), 1 << rng.randrange(8)
    data = bytearray((log_dir / "data.mdb").read_bytes())
    at = data.find(value)
    assert at >= 0
    while at >= 0:  # copy-on-write leaves stale copies in free pages; flip every copy
        data[at + offset] ^= mask
        at = data.find(value, at + 1)
    (log_dir / "data.mdb").write_bytes(bytes(data))
    reader = LogReader.open(log_dir)
    with pytest.raises(CorruptRecordError) as info:
        reader.verify()
    assert info.value.lsn == lsn and f"record LSN {lsn}" in str(info.value)
    with pytest.raises(CorruptRecordError):
        list(reader.records(lsn, lsn))
    intact = [r.lsn for r in reader.records(1, lsn - 1)]  # records before it still read
    assert intact == list(range(1, lsn))
    reader.close()


TRUNCATE_CHILD = """
import sys
from commitlog import CommitLogError, LogReader
try:
    reader = LogReader.open(sys.argv[1])
    reader.verify()
    print("OPENED")
except CommitLogError as exc:
    print(type(exc).__name__, "|", exc)
"""


def test_truncated_data_file_is_reported_not_crashed(log_dir: Path, tmp_path: Path) -> None:
    _write_log(log_dir)
    size = (log_dir / "data.mdb").stat().st_size
    for keep in (size - 4096, size // 2, 8192, 100, 0):
        copy = tmp_path / f"cut-{keep}"
        shutil.copytree(log_dir, copy)
        with open(copy / "data.mdb", "r+b") as f:
            f.truncate(keep)
        # A subprocess, so a SIGBUS from reading past the end of the file would show as a failure here.
        proc = subprocess.run([sys.executable, "-c", TRUNCATE_CHILD, str(copy)],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, (keep, proc.returncode, proc.stderr)
        assert proc.stdout.startswith("CorruptRecordError |"), (keep, proc.stdout)
        assert "truncated" in proc.stdout or "not a valid LMDB file" in proc.stdout
        assert "Traceback" not in proc.stderr


def test_a_first_write_that_would_crash_the_process_refuses_the_open_with_the_salvage_command(
        log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage that only a write reaches (a free-list page: recovery's reads never touch it) crashed the
    server inside LMDB (SIGBUS) at its first write. The preflight child now makes that write, aborted;
    here the trial write itself is made to crash, as such a page makes it."""
    import os
    import signal

    from commitlog.wal import Wal

    _write_log(log_dir, num_requests=2)

    def crash(_wal: Wal, _groups: object) -> None:
        os.kill(os.getpid(), signal.SIGBUS)

    monkeypatch.setattr(Wal, "trial_write", crash)
    with pytest.raises(CorruptRecordError, match="tokenledger salvage"):
        Ledger.open(log_dir, FAST)
    monkeypatch.undo()
    Ledger.open(log_dir, FAST).close()  # the refused open held nothing, and the log was not touched


def test_a_damaged_meta_page_refuses_the_open_naming_the_backup_and_leaves_the_log_unlocked(log_dir: Path) -> None:
    """LMDB refuses a file whose first meta page lost its magic (found by the page-damage fuzz test):
    the open says what to do (nothing is readable: restore a backup, as salvage says too), and it gives
    the writer lock back, so the next open (after the restore, or in the same process) is not refused as
    locked by another writer."""
    _write_log(log_dir)
    with open(log_dir / "data.mdb", "r+b") as f:
        f.seek(14)
        f.write(b"\xaa\r\xd6\xc9\xd9\xbbA\x8d" * 2 + b"\xaa\r")  # page 0's header and meta magic
    for _ in range(2):  # a second open meets the same damage, not a lock still held by the first
        with pytest.raises(CorruptRecordError, match=r"not a valid LMDB file .*restore the log directory from a backup"):
            Ledger.open(log_dir, FAST)


def test_an_unreadable_per_request_index_page_refuses_the_open_and_salvage_rebuilds_it(log_dir: Path, tmp_path: Path) -> None:
    """A damaged by_rid page (found by the page-damage fuzz test): every reader refuses the log, and the
    first index write after a restart would stop the server's writer. The open refuses it, naming salvage;
    the salvaged copy (index rebuilt from the records) opens, with every request in it."""
    _write_log(log_dir, num_requests=4)
    damage_index_pages(log_dir, "req-3")
    with pytest.raises(CorruptRecordError, match=r"per-request index \(by_rid\) is unreadable.*tokenledger salvage"):
        Ledger.open(log_dir, FAST)
    salvage(log_dir, tmp_path / "salvaged")
    ledger = Ledger.open(tmp_path / "salvaged", FAST)
    ledger.close()
    reader = LogReader.open(tmp_path / "salvaged")
    assert reader.request_ids() == [f"req-{r}" for r in range(4)]
    reader.close()


def test_a_log_whose_records_table_is_gone_from_the_directory_is_refused_not_begun_again(log_dir: Path) -> None:
    """A damaged directory page (LMDB's main table, found by the page-damage fuzz test) can hide a table
    from the lookup. A restart that created it anew would log LSN 1 again inside a log it never read: the
    open refuses instead, names the backup, and leaves the file without a second records table."""
    _write_log(log_dir, num_requests=2)
    env = lmdb.open(str(log_dir), max_dbs=8)
    records = env.open_db(b"records")
    with env.begin(write=True) as txn:
        txn.drop(records, delete=True)
    env.close()
    with pytest.raises(CommitLogError, match="not a tokenledger log, or its directory of tables is damaged.*backup"):
        Ledger.open(log_dir, FAST)
    env = lmdb.open(str(log_dir), max_dbs=8, readonly=True)
    with env.begin() as txn:
        assert sorted(bytes(key) for key, _ in txn.cursor()) == [b"by_rid", b"live", b"meta"]
    env.close()


def test_an_lmdb_file_with_no_table_yet_opens_as_a_new_log(log_dir: Path) -> None:
    """A crash between LMDB creating the file and the first open creating the tables leaves a file with
    no table: that is a new log, not a damaged one (the tables are made in one txn, so never only some)."""
    lmdb.open(str(log_dir), max_dbs=8).close()
    ledger = Ledger.open(log_dir, FAST)
    ledger.close()
    reader = LogReader.open(log_dir)
    assert reader.last_lsn() >= 2  # SERVER_START, SERVER_STOP
    reader.close()
