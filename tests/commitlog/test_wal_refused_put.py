"""A put that LMDB refuses (an LSN already in the log) must fail the group, never vanish (I5)."""
from __future__ import annotations

from pathlib import Path

import pytest
from commitlog_helpers import FAST

from commitlog.codec import EncodedGroup, lsn_key
from commitlog.errors import DuplicateLsnError
from commitlog.wal import Wal


def test_write_group_raises_when_next_lsn_already_exists_and_commits_nothing(tmp_path: Path) -> None:
    wal = Wal.open(tmp_path, FAST)
    try:
        # A second writer got there first: LSN 1 is already in the table.
        with wal.env.begin(write=True) as txn:
            txn.put(lsn_key(1), b"other-writer", db=wal.records)
        group = EncodedGroup(1, 2, [(lsn_key(1), b"mine"), (lsn_key(2), b"mine")], [],
                             meta=[(b"probe", b"1")])
        with pytest.raises(DuplicateLsnError, match="LSN 1"):
            wal.write_group(group)
        with wal.env.begin() as txn:
            assert txn.get(lsn_key(1), db=wal.records) == b"other-writer"
            assert txn.get(lsn_key(2), db=wal.records) is None  # whole group aborted
            assert txn.get(b"probe", db=wal.meta) is None
    finally:
        wal.close()
