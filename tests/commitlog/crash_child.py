"""Crash-test child: writes groups forever and reports each durable LSN on stdout, from the callback."""
from __future__ import annotations

import os
import random
import sys

from commitlog import Durability, FinishReason, Ledger, WalConfig


def on_durable(lsn: int, error: BaseException | None) -> None:
    if error is None:
        os.write(1, f"{lsn}\n".encode())  # unbuffered: what the parent reads was really reported


def main(log_dir: str, seed: int) -> None:
    rng = random.Random(seed)
    ledger = Ledger.open(log_dir, WalConfig(durability=Durability.FSYNC, max_pending_groups=4))
    os.write(1, b"ready\n")
    n = 0
    while True:
        n += 1
        rid = f"{seed}-{n}"
        ledger.begin(rid, [n, n + 1], {"temperature": 0.0})
        for rid_live in list(ledger.live):
            txn = ledger.txn(rid_live)
            txn.append_token(n, -0.5, [(n, -0.5)])
            if rng.random() < 0.2:
                txn.set_finish(FinishReason.STOP)
            txn.commit() if rng.random() < 0.8 else txn.rollback("rejected")
        ledger.flush(on_durable)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
