"""The writer thread: write-ahead callbacks (I5), map growth, fatal errors, durability modes."""
from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest
from commitlog_helpers import FAST, sync_flush

from commitlog import (
    Durability,
    Encoder,
    Entry,
    Kind,
    Ledger,
    LogFullError,
    LogLockedError,
    LogReader,
    Wal,
    WalConfig,
    WalWriter,
    WriterFailedError,
)


def _groups(n: int, per_group: int = 4) -> list:
    enc = Encoder()
    return [enc.encode([Entry(Kind.COMMIT, f"r{g}", {"ids": [g, i], "lp": [-0.5] * 2}) for i in range(per_group)])
            for g in range(n)]


def test_i5_durable_callback_fires_only_once_the_group_is_in_the_log(log_dir: Path) -> None:
    wal = Wal.open(log_dir, FAST)
    writer = WalWriter(wal, FAST)
    seen: list[tuple[int, int]] = []

    def on_durable(lsn: int, error: BaseException | None) -> None:
        assert error is None
        seen.append((lsn, LogReader(wal).last_lsn()))  # runs on the writer thread

    for group in _groups(20):
        writer.submit(group, on_durable)
    writer.close()
    wal.close()
    assert [lsn for lsn, _ in seen] == [4 * (g + 1) for g in range(20)]
    assert all(visible >= lsn for lsn, visible in seen)


def test_map_grows_under_a_tiny_initial_map_without_losing_a_record(log_dir: Path) -> None:
    cfg = WalConfig(durability=Durability.NONE, initial_map_size=64 << 10)
    wal = Wal.open(log_dir, cfg)
    writer = WalWriter(wal, cfg)
    groups = _groups(400, per_group=16)
    for group in groups:
        writer.submit(group)
    writer.close()
    assert wal.env.info()["map_size"] > 64 << 10
    reader = LogReader(wal)
    assert reader.verify().num_records == 400 * 16
    assert [r.payload["ids"] for r in reader.records(17, 18)] == [[1, 0], [1, 1]]
    wal.close()


def test_map_full_at_max_map_size_is_a_log_full_error_not_a_retry_loop(log_dir: Path) -> None:
    cfg = WalConfig(durability=Durability.NONE, initial_map_size=64 << 10, max_map_size=128 << 10)
    wal = Wal.open(log_dir, cfg)
    writer = WalWriter(wal, cfg)
    errors: list[BaseException | None] = []
    for group in _groups(400, per_group=16):
        try:
            writer.submit(group, lambda lsn, err: errors.append(err))
        except WriterFailedError:
            break
    with pytest.raises(WriterFailedError, match="max_map_size"):
        writer.close()
    assert isinstance(writer.error.__cause__, LogFullError)
    assert any(isinstance(e, WriterFailedError) for e in errors)
    wal.close()


def test_write_error_is_fatal_loud_and_never_retried(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal = Wal.open(log_dir, FAST)
    writer = WalWriter(wal, FAST)
    calls: list[int] = []

    def broken(group: object) -> None:
        calls.append(1)
        raise lmdb.DiskError("mdb_txn_commit: Input/output error")

    monkeypatch.setattr(wal, "_write_once", broken)
    got: list[BaseException | None] = []
    done = threading.Event()
    g1, g2 = _groups(2)
    writer.submit(g1, lambda lsn, err: (got.append(err), done.set()))
    assert done.wait(5)
    assert len(calls) == 1 and isinstance(got[0], WriterFailedError)
    assert "Input/output error" in str(got[0]) and writer.durable_lsn == 0
    with pytest.raises(WriterFailedError):
        writer.submit(g2)
    with pytest.raises(WriterFailedError):
        writer.close()
    wal.close()


def test_periodic_durability_calls_back_only_after_a_sync(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = WalConfig(durability=Durability.PERIODIC, sync_interval_ms=30)
    wal = Wal.open(log_dir, cfg)
    syncs: list[int] = []
    real_sync = wal.sync
    monkeypatch.setattr(wal, "sync", lambda: (syncs.append(1), real_sync())[1])
    writer = WalWriter(wal, cfg)
    fired = threading.Event()
    synced_at_callback: list[int] = []
    writer.submit(_groups(1)[0], lambda lsn, err: (synced_at_callback.append(len(syncs)), fired.set()))
    assert fired.wait(5)
    assert synced_at_callback == [1] and writer.durable_lsn == 4
    writer.close()
    wal.close()


def test_fsync_mode_opens_the_environment_synchronous(log_dir: Path) -> None:
    wal = Wal.open(log_dir, WalConfig(durability=Durability.FSYNC))
    assert wal.env.flags()["sync"] and wal.env.flags()["metasync"]
    wal.close()
    wal = Wal.open(log_dir, FAST)
    assert not wal.env.flags()["sync"]
    wal.close()


def test_a_second_writer_on_the_same_log_is_refused(ledger: Ledger, log_dir: Path) -> None:
    with pytest.raises(LogLockedError, match="stop it first"):
        Wal.open(log_dir, FAST)


def test_in_process_reads_go_through_the_writer_thread(ledger: Ledger) -> None:
    ledger.begin("r", [1], {})
    lsn = sync_flush(ledger)
    assert ledger.read(lambda r: r.last_lsn()) == lsn


def test_config_rejects_bad_values() -> None:
    for kwargs in ({"sync_interval_ms": 0}, {"initial_map_size": 0}, {"max_pending_groups": 0},
                   {"initial_map_size": 2 << 20, "max_map_size": 1 << 20}):
        with pytest.raises(ValueError):
            WalConfig(**kwargs)
