"""The commit log's error hierarchy: every failure at the log boundary is one of these."""
from __future__ import annotations

SALVAGE_HINT = "tokenledger salvage --log-dir {log_dir} --out {log_dir}.salvaged"


class CommitLogError(Exception):
    """Base of every error the commit log raises on purpose."""


class CorruptRecordError(CommitLogError):
    """A record failed its CRC, hash-chain, LSN or structure check; `lsn` names it."""

    def __init__(self, message: str, lsn: int | None = None, log_dir: str | None = None) -> None:
        where = f"record LSN {lsn}: " if lsn is not None else ""
        hint = ""
        if log_dir is not None:
            hint = (
                "; the log will not be opened for writing. Copy out every intact record with `"
                + SALVAGE_HINT.format(log_dir=log_dir)
                + "` and start the server on the copy"
            )
        super().__init__(f"{where}{message}{hint}")
        self.detail = message
        self.lsn = lsn
        self.log_dir = log_dir


class FormatVersionError(CommitLogError):
    """The log was written by a format version this code does not read."""


class LogFullError(CommitLogError):
    """The map reached `max_map_size`; raise the limit or apply retention."""


class WriterFailedError(CommitLogError):
    """The writer thread hit a fatal write error; nothing more can be logged."""


class TxnStateError(CommitLogError):
    """A transaction or step was used out of order (e.g. staged after commit)."""


class UnknownRequestError(CommitLogError):
    """No request with this id is live in the ledger, or none is in the log."""


class LogLockedError(CommitLogError):
    """Another process holds the log open for writing."""


class RequestRefusedError(CommitLogError, ValueError):
    """`Ledger.begin` refused a request (malformed rid, or one already live): that request
    fails, nothing is logged for it, and the server goes on."""


class DuplicateLsnError(CommitLogError):
    """LMDB refused a record put because its LSN is already in the log: another writer, or a bug. Fatal."""
