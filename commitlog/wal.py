"""The LMDB environment behind the log: tables, opening rules, and one group's write txn."""
from __future__ import annotations

import enum
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import lmdb

from commitlog.codec import FORMAT_VERSION, EncodedGroup, key_lsn, pack_lsns, unpack_lsns
from commitlog.errors import (
    CommitLogError,
    CorruptRecordError,
    DuplicateLsnError,
    FormatVersionError,
    LogFullError,
    LogLockedError,
)

RECORDS_DB = b"records"  # LSN (8 bytes BE) -> record value
INDEX_DB = b"by_rid"  # rid -> its LSNs packed (8 bytes BE each), written once at FINISH
LIVE_DB = b"live"  # rid -> BEGIN LSN for requests without FINISH; recovery reads only this
META_DB = b"meta"
META_FORMAT = b"format_version"
META_FINGERPRINT = b"model_fingerprint"
META_TOKENIZER_DIR = b"tokenizer_dir"  # of the latest server start; lets replay decode text
META_INSTANCE_PREFIX = b"instance:"
DATA_FILE = "data.mdb"
_MIN_DATA_FILE = 2 * 4096


class Durability(enum.Enum):
    FSYNC = "fsync"  # every group's write txn is fsynced before its callback
    PERIODIC = "periodic"  # the writer thread syncs every `sync_interval_ms`
    NONE = "none"  # callbacks fire at commit; survives a process crash, not an OS crash


@dataclass(frozen=True, slots=True)
class WalConfig:
    durability: Durability = Durability.FSYNC
    sync_interval_ms: int = 50
    initial_map_size: int = 64 << 20
    max_map_size: int = 1 << 40
    max_pending_groups: int = 64

    def __post_init__(self) -> None:
        if self.sync_interval_ms <= 0:
            raise ValueError(f"sync_interval_ms must be > 0, got {self.sync_interval_ms}")
        if not 0 < self.initial_map_size <= self.max_map_size:
            raise ValueError("need 0 < initial_map_size <= max_map_size")
        if self.max_pending_groups < 1:
            raise ValueError(f"max_pending_groups must be >= 1, got {self.max_pending_groups}")


def _open_tables(env: lmdb.Environment, readonly: bool) -> tuple[lmdb._Database, ...]:
    """The four tables; a writer creates them only in a new file (no table at all), and all in one txn.

    Creating a table that an existing file lacks would begin a second log inside the first: a damaged
    directory page (LMDB's main table) can hide `records` from the lookup, and a restart would then
    write LSN 1 again over a log it never read. LMDB's count of the main table comes from the meta page,
    not from the page that may be damaged. A missing table raises `lmdb.NotFoundError`."""
    names = (RECORDS_DB, INDEX_DB, LIVE_DB, META_DB)
    if readonly or env.stat()["entries"] > 0:
        return tuple(env.open_db(name, create=False) for name in names)
    with env.begin(write=True) as txn:  # a crash part-way leaves no table, not some
        return tuple(env.open_db(name, txn=txn, create=True) for name in names)


class Wal:
    """An open LMDB environment and its four tables. Writes happen on one thread only."""

    def __init__(self, log_dir: Path, env: lmdb.Environment, readonly: bool, max_map_size: int) -> None:
        self.log_dir = log_dir
        self.env = env
        self.readonly = readonly
        self.max_map_size = max_map_size
        self.records, self.index, self.live, self.meta = _open_tables(env, readonly)
        self._lock_fd: int | None = None
        self.closed = False

    @classmethod
    def open(cls, log_dir: str | os.PathLike[str], config: WalConfig | None = None, readonly: bool = False) -> Wal:
        cfg = config or WalConfig()
        path = Path(log_dir)
        if readonly and not (path / DATA_FILE).exists():
            raise CommitLogError(f"no log at {path} (missing {DATA_FILE}); check --log-dir")
        path.mkdir(parents=True, exist_ok=True)
        _check_meta_pages_present(path)
        lock_fd = None if readonly else _take_writer_lock(path)
        sync = cfg.durability is Durability.FSYNC
        try:
            env = lmdb.Environment(str(path), map_size=cfg.initial_map_size, max_dbs=8, readonly=readonly,
                                   sync=sync, metasync=sync, readahead=False)
        except lmdb.InvalidError as exc:
            # LMDB refuses the file when either meta page's magic or version is damaged, and `salvage` reads
            # through LMDB too: nothing can be read here, so the way out is the backup (as salvage says).
            _release(lock_fd)
            raise CorruptRecordError(f"{path / DATA_FILE} is not a valid LMDB file ({exc}): no record can be "
                                     "read from it; restore the log directory from a backup") from None
        except lmdb.Error as exc:
            _release(lock_fd)
            raise CommitLogError(f"cannot open log at {path}: {exc}") from None
        try:
            _check_not_truncated(env, path)
            wal = cls(path, env, readonly, cfg.max_map_size)
        except lmdb.NotFoundError:
            env.close()
            _release(lock_fd)
            raise CommitLogError(f"{path} is an LMDB environment but not a tokenledger log, or its directory of "
                                 "tables is damaged: restore the log directory from a backup") from None
        except (CommitLogError, lmdb.Error) as exc:
            env.close()
            _release(lock_fd)
            if isinstance(exc, CommitLogError):
                raise
            raise CorruptRecordError(f"{path / DATA_FILE} is damaged: its tables cannot be opened ({exc}); no record "
                                     "can be read from it: restore the log directory from a backup") from None
        wal._lock_fd = lock_fd
        try:
            wal._check_format()
        except lmdb.Error as exc:
            wal.close()  # and the writer lock with it: a refused open holds nothing
            raise CorruptRecordError(f"{path / DATA_FILE} is damaged: its meta table cannot be read ({exc}); no "
                                     "record can be read from it: restore the log directory from a backup") from None
        except BaseException:
            wal.close()
            raise
        return wal

    def _check_format(self) -> None:
        with self.env.begin(db=self.meta, write=not self.readonly) as txn:
            stored = txn.get(META_FORMAT)
            if stored is None and not self.readonly:
                txn.put(META_FORMAT, str(FORMAT_VERSION).encode())
            elif stored is not None and _format_number(stored) != FORMAT_VERSION:
                number = _format_number(stored)
                shown = str(number) if number is not None else f"{stored!r} (damaged: not a number)"
                raise FormatVersionError(f"log at {self.log_dir} has format {shown}; this build reads {FORMAT_VERSION}")

    def write_group(self, group: EncodedGroup) -> None:
        """One LMDB write txn for the whole group; grows the map and retries on MapFullError."""
        self.write_groups([group])

    def write_groups(self, groups: list[EncodedGroup]) -> None:
        """Consecutive groups in ONE write txn (one fsync under `fsync`), each applied in order exactly
        as alone; all or none of them are committed. Grows the map and retries on MapFullError."""
        while True:
            try:
                self._write_once(groups)
                return
            except lmdb.MapFullError:
                self._grow()

    def trial_write(self, groups: list[EncodedGroup]) -> None:
        """Applies `groups` as `write_groups` would, then aborts: nothing reaches the file. Recovery's
        preflight runs an open's first write this way in a forked child, so that a damaged page which
        would crash it (SIGBUS inside LMDB: the reads alone need not touch the pages a write does, such
        as the free list's) crashes the child instead of the server. A full map ends the trial early:
        the real write grows the map and retries."""
        txn = self.env.begin(write=True)
        try:
            for group in groups:
                self._apply(txn, group)
        except lmdb.MapFullError:
            pass
        finally:
            txn.abort()

    def _write_once(self, groups: list[EncodedGroup]) -> None:
        with self.env.begin(write=True) as txn:
            for group in groups:
                self._apply(txn, group)

    def _apply(self, txn: lmdb.Transaction, group: EncodedGroup) -> None:
        with txn.cursor(self.records) as cur:
            # MDB_APPEND refuses an LSN at or below the last one without raising; a short count means
            # another writer (or a bug) already used these LSNs, and the group must not be called durable.
            _consumed, added = cur.putmulti(group.records, append=True)
        if added != len(group.records):
            raise DuplicateLsnError(_refused_message(txn, self.records, group))
        for rid, packed in group.index:
            # Append, never overwrite: a rid used again after it finished keeps every earlier
            # incarnation findable (issue 10 C.14; FORMAT.md "Tables"). LSNs only grow, so it stays sorted.
            earlier = txn.get(rid, db=self.index)
            txn.put(rid, packed if earlier is None else bytes(earlier) + packed, db=self.index)
        for rid, lsn in group.live_puts:
            txn.put(rid, lsn, db=self.live)
        for rid in group.live_deletes:
            txn.delete(rid, db=self.live)
        for key, value in group.meta:
            txn.put(key, value, db=self.meta)
        self._delete_records(txn, group.deletes)

    def _delete_records(self, txn: lmdb.Transaction, deletes: list[tuple[bytes, bytes | None]]) -> None:
        """Retention's deletes; a rid's index entry loses exactly the deleted LSNs (a later incarnation
        of the same rid keeps its own), and goes when none is left."""
        dropped: dict[bytes, set[int]] = {}
        for key, rid in deletes:
            txn.delete(key, db=self.records)
            if rid is not None:
                dropped.setdefault(rid, set()).add(key_lsn(key))
        for rid, lsns in dropped.items():
            packed = txn.get(rid, db=self.index)
            kept = [] if packed is None else [lsn for lsn in unpack_lsns(packed) if lsn not in lsns]
            if kept:
                txn.put(rid, pack_lsns(kept), db=self.index)
            else:
                txn.delete(rid, db=self.index)

    def _grow(self) -> None:
        current = self.env.info()["map_size"]
        if current >= self.max_map_size:
            raise LogFullError(
                f"log at {self.log_dir} reached max_map_size={self.max_map_size} bytes; "
                "raise the limit or apply retention (drop finished requests) and compact")
        self.env.set_mapsize(min(current * 2, self.max_map_size))

    def sync(self) -> None:
        self.env.sync(True)

    def put_meta(self, key: bytes, value: bytes) -> None:
        with self.env.begin(db=self.meta, write=True) as txn:
            txn.put(key, value)

    def get_meta(self, key: bytes) -> bytes | None:
        with self.env.begin(db=self.meta) as txn:
            return txn.get(key)

    def close(self) -> None:
        self.closed = True
        self.env.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _release(lock_fd: int | None) -> None:
    if lock_fd is not None:
        os.close(lock_fd)


def _format_number(stored: bytes) -> int | None:
    return int(stored) if stored.isdigit() else None


def _take_writer_lock(path: Path) -> int:
    """One writer per log, across processes; released by the kernel if the process dies.

    The lock is an `flock` on the log *directory* itself, not on a file in it (issue 10 E.17): a
    `writer.lock` file could be unlinked while held, and the next server would lock a fresh file of
    the same name and write the same log. The directory cannot be unlinked while it holds the log
    (and moving it moves the log with its lock). It exists before LMDB creates `data.mdb`, so the
    lock covers recovery too; `data.mdb` could itself be replaced, and `lock.mdb` carries LMDB's own
    fcntl locks. `commitlog.audit.writer_alive` looks for this lock on the directory's inode."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogLockedError(f"another process has {path} open for writing; stop it first") from None
    return fd


def _check_meta_pages_present(path: Path) -> None:
    """An existing data file shorter than LMDB's two meta pages would be re-initialised: refuse."""
    data = path / DATA_FILE
    if data.exists() and data.stat().st_size < _MIN_DATA_FILE:
        raise CorruptRecordError(
            f"{data} is truncated to {data.stat().st_size} bytes, shorter than LMDB's two meta pages; "
            "no record can be read from it; restore the log directory from a backup")


def _check_not_truncated(env: lmdb.Environment, path: Path) -> None:
    """Reading a page past the end of a truncated file would kill the process with SIGBUS."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = (path / DATA_FILE).stat().st_size
    if size < needed:
        env.close()
        raise CorruptRecordError(
            f"{path / DATA_FILE} is truncated: {size} bytes on disk, the last committed "
            f"transaction needs {needed}; records past byte {size} are lost and reading them would "
            "crash the process (SIGBUS); restore the log directory from a backup")


def _refused_message(txn: lmdb.Transaction, records: lmdb._Database, group: EncodedGroup) -> str:
    """Names the first LSN of the group that LMDB would not append, so the operator can find the other writer."""
    for key, _value in group.records:
        if txn.get(key, db=records) is not None:
            return (f"LSN {int.from_bytes(key, 'big')} is already in the log: another writer is using it; "
                    "group aborted, nothing from it is durable")
    return f"LMDB refused part of group LSN {group.first_lsn}..{group.last_lsn}; group aborted"
