"""Helpers shared by the commit-log tests (imported by name: tests are not a package)."""
from __future__ import annotations

from commitlog import Durability, Ledger, WalConfig

FAST = WalConfig(durability=Durability.NONE)


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
