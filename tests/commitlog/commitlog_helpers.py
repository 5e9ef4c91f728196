"""Helpers shared by the commit-log tests (imported by name: tests are not a package)."""
from __future__ import annotations

from pathlib import Path

from commitlog import Durability, Ledger, WalConfig

FAST = WalConfig(durability=Durability.NONE)
PAGE = 4096  # LMDB's page size here


class FakeMatcher:
    """A grammar matcher that accepts every token except those in `reject`."""

    def __init__(self, reject: frozenset[int] = frozenset()) -> None:
        self.accepted: list[int] = []
        self.reject = reject

    def accept_token(self, token_id: int) -> bool:
        if token_id in self.reject:
            return False
        self.accepted.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        assert 0 < num_tokens <= len(self.accepted)
        del self.accepted[-num_tokens:]


def crash(ledger: Ledger) -> None:
    """Stop a ledger the way a crash would: no FINISH for live requests, no SERVER_STOP."""
    ledger.writer.close()
    ledger.wal.close()


def sync_flush(ledger: Ledger) -> int | None:
    lsn = ledger.flush()
    if lsn is not None:
        ledger.writer.wait_durable(lsn, timeout=10)
    return lsn


def damage_index_pages(log_dir: Path, rid: str) -> None:
    """Overwrite the header of every page holding `rid`'s per-request index node (LMDB then says
    MDB_CORRUPTED there). The node is found by its key size (2 bytes LE) just before the key; a record
    holds the rid after a msgpack string byte instead, so no records page is touched."""
    data = bytearray((log_dir / "data.mdb").read_bytes())
    node = len(rid).to_bytes(2, "little") + rid.encode()
    pages = {at // PAGE for at in range(len(data)) if data.startswith(node, at)}
    assert pages, f"no index node of {rid!r} in the file"
    for page in pages:
        data[page * PAGE:page * PAGE + 16] = b"\xff" * 16
    (log_dir / "data.mdb").write_bytes(bytes(data))
