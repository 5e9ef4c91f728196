"""tokenledger's commit log: request transactions written ahead to LMDB. No torch, no server."""
from __future__ import annotations

from commitlog.codec import FORMAT_VERSION, EncodedGroup, Encoder, Entry, Kind, Record
from commitlog.cursor import BatchCursors, PackedCursor
from commitlog.errors import (
    CommitLogError,
    CorruptRecordError,
    FormatVersionError,
    LogFullError,
    LogLockedError,
    RequestRefusedError,
    TxnStateError,
    UnknownRequestError,
    WriterFailedError,
)
from commitlog.head import ChainHead, read_head
from commitlog.ledger import Ledger, Step
from commitlog.reader import LogReader, VerifyReport
from commitlog.recovery import RecoveryReport
from commitlog.retention import RetentionPolicy, apply_retention, compact
from commitlog.salvage import SalvageReport, salvage
from commitlog.state import DoomSource, FinishReason, RequestState, replay
from commitlog.txn import GrammarMatcher, Outcome, RequestTxn
from commitlog.wal import Durability, Wal, WalConfig
from commitlog.writer import DurableCallback, WalWriter

__all__ = [
    "FORMAT_VERSION", "BatchCursors", "ChainHead", "CommitLogError", "CorruptRecordError", "DoomSource", "Durability",
    "DurableCallback", "EncodedGroup", "Encoder", "Entry", "FinishReason", "FormatVersionError", "GrammarMatcher",
    "Kind", "Ledger", "LogFullError", "LogLockedError", "LogReader", "Outcome", "PackedCursor", "Record",
    "RecoveryReport", "RequestRefusedError", "RequestState", "RequestTxn", "RetentionPolicy", "SalvageReport", "Step", "TxnStateError",
    "UnknownRequestError", "VerifyReport", "Wal", "WalConfig", "WalWriter", "WriterFailedError",
    "apply_retention", "compact", "read_head", "replay", "salvage",
]
