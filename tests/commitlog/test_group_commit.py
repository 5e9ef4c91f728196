"""Group commit across steps: groups that queue while the writer is busy (in an fsync) share its
next write txn, so one sync makes them all durable; I5 and the chain hold for each of them."""
from __future__ import annotations

import threading
from pathlib import Path

import lmdb
import pytest

from commitlog import Durability, Encoder, Entry, Kind, LogReader, Wal, WalConfig, WalWriter, WriterFailedError

FSYNC = WalConfig(durability=Durability.FSYNC)


def _groups(n: int, per_group: int = 3) -> list:
    enc = Encoder()
    return [enc.encode([Entry(Kind.COMMIT, f"r{g}", {"ids": [g, i]}) for i in range(per_group)]) for g in range(n)]


class _HeldWrites:
    """Wraps `wal.write_groups`: the first call blocks until released (an fsync that takes its time),
    and every call's groups are recorded."""

    def __init__(self, wal: Wal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        real = wal.write_groups

        def write_groups(groups: list) -> None:
            self.calls.append([g.last_lsn for g in groups])
            if len(self.calls) == 1:
                self.entered.set()
                assert self.release.wait(10)
            real(groups)

        monkeypatch.setattr(wal, "write_groups", write_groups)

    def submit_behind(self, writer: WalWriter, groups: list, callbacks: list | None = None) -> None:
        """Submits the first group, waits until the writer is held inside its write, then queues the rest."""
        callbacks = callbacks or [None] * len(groups)
        writer.submit(groups[0], callbacks[0])
        assert self.entered.wait(10)
        for group, callback in zip(groups[1:], callbacks[1:]):
            writer.submit(group, callback)


def _held_writer(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Wal, _HeldWrites, WalWriter]:
    """An fsync log whose writer's first write txn is held until `release` is set."""
    wal = Wal.open(log_dir, FSYNC)
    held = _HeldWrites(wal, monkeypatch)
    return wal, held, WalWriter(wal, FSYNC)


def test_groups_queued_behind_a_busy_fsync_share_one_write_txn(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal, held, writer = _held_writer(log_dir, monkeypatch)
    held.submit_behind(writer, _groups(6))
    held.release.set()
    writer.close()
    # One txn (one fsync) for the first, one for the five that waited: not six.
    assert held.calls == [[3], [6, 9, 12, 15, 18]]
    assert LogReader(wal).verify().num_records == 18
    wal.close()


def test_i5_each_batched_group_is_called_back_with_its_own_lsn_only_once_durable(
        log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal, held, writer = _held_writer(log_dir, monkeypatch)
    seen: list[tuple[int, int, int]] = []

    def on_durable(lsn: int, error: BaseException | None) -> None:
        assert error is None
        seen.append((lsn, writer.durable_lsn, LogReader(wal).last_lsn()))  # on the writer thread

    groups = _groups(4)
    held.submit_behind(writer, groups, [on_durable] * len(groups))
    assert seen == []
    held.release.set()
    writer.close()
    assert [lsn for lsn, _, _ in seen] == [3, 6, 9, 12]
    assert all(durable >= lsn and visible >= lsn for lsn, durable, visible in seen)
    assert writer.durable_head == (12, groups[-1].last_hash)
    wal.close()


def test_a_failed_batched_txn_fails_every_group_in_it_and_commits_none(
        log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal, held, writer = _held_writer(log_dir, monkeypatch)
    errors: dict[int, BaseException | None] = {}
    groups = _groups(4)
    held.submit_behind(writer, groups, [lambda lsn, err, g=g: errors.__setitem__(g, err) for g in range(len(groups))])

    real = wal._write_once

    def broken_when_batched(batch: list) -> None:
        if len(batch) > 1:
            raise lmdb.DiskError("mdb_txn_commit: Input/output error")
        real(batch)

    monkeypatch.setattr(wal, "_write_once", broken_when_batched)
    held.release.set()
    with pytest.raises(WriterFailedError):
        writer.close()
    assert errors[0] is None
    assert sorted(errors) == [0, 1, 2, 3]
    assert all(isinstance(errors[g], WriterFailedError) for g in (1, 2, 3))
    assert writer.durable_lsn == 3 and LogReader(wal).last_lsn() == 3
    wal.close()


def test_a_job_queued_between_groups_runs_after_the_earlier_ones_and_before_the_later(
        log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal, held, writer = _held_writer(log_dir, monkeypatch)
    groups = _groups(4)
    held.submit_behind(writer, groups[:2])
    seen_by_job = writer.call(lambda w: LogReader(w).last_lsn())
    writer.submit(groups[2])
    writer.submit(groups[3])
    held.release.set()
    assert seen_by_job.result(10) == 6
    writer.close()
    assert held.calls == [[3], [6], [9, 12]]
    wal.close()


def test_write_groups_in_one_txn_applies_each_group_as_if_alone(log_dir: Path) -> None:
    """A rid that finishes in one group and runs again in the next, both in one txn: the index keeps
    both incarnations and `live` ends with none, as two txns would leave them."""
    enc = Encoder()
    first = enc.encode([Entry(Kind.BEGIN, "r", {"prompt": [1]}), Entry(Kind.FINISH, "r", {"reason": "stop"})])
    again = enc.encode([Entry(Kind.BEGIN, "r", {"prompt": [2]}), Entry(Kind.FINISH, "r", {"reason": "stop"})])
    wal = Wal.open(log_dir, FSYNC)
    wal.write_groups([first, again])
    with wal.env.begin() as txn:
        assert txn.get(b"r", db=wal.index) == b"".join(i.to_bytes(8, "big") for i in (1, 2, 3, 4))
        assert txn.get(b"r", db=wal.live) is None
    assert LogReader(wal).verify().num_records == 4
    wal.close()


def test_a_failed_periodic_sync_calls_each_waiting_group_back_once(log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = WalConfig(durability=Durability.PERIODIC, sync_interval_ms=1)
    wal = Wal.open(log_dir, cfg)

    def broken_sync() -> None:
        raise lmdb.DiskError("fsync: Input/output error")

    monkeypatch.setattr(wal, "sync", broken_sync)
    writer = WalWriter(wal, cfg)
    calls: list[BaseException | None] = []
    done = threading.Event()
    threading.Event().wait(0.01)  # the interval has run out: the sync happens inside the group's write
    writer.submit(_groups(1)[0], lambda lsn, err: (calls.append(err), done.set()))
    assert done.wait(10)
    with pytest.raises(WriterFailedError):
        writer.close()
    assert len(calls) == 1 and isinstance(calls[0], WriterFailedError)
    wal.close()
