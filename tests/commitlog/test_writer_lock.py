"""One writer per log, whatever happens to files in its directory (issue 10 E.17, second half):
deleting `writer.lock` used to let a second server write the same log."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from commitlog_helpers import FAST

from commitlog import Ledger, LogLockedError
from commitlog.audit import writer_alive

ROOT = Path(__file__).resolve().parents[2]
OPEN_CHILD = """
import sys
from commitlog import Ledger, LogLockedError, WalConfig, Durability
try:
    Ledger.open(sys.argv[1], WalConfig(durability=Durability.NONE)).close()
except LogLockedError as exc:
    print("refused:", exc)
    sys.exit(3)
"""


def _unlink_lock_files(log_dir: Path) -> None:
    """What a careless operator does to a 'stale' lock file (older versions locked writer.lock)."""
    (log_dir / "writer.lock").unlink(missing_ok=True)


def test_second_writer_is_refused_after_writer_lock_is_unlinked(ledger: Ledger, log_dir: Path) -> None:
    _unlink_lock_files(log_dir)
    child = subprocess.run([sys.executable, "-c", OPEN_CHILD, str(log_dir)], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 3 and "refused" in child.stdout, (child.returncode, child.stdout, child.stderr)
    with pytest.raises(LogLockedError, match="stop it first"):
        Ledger.open(log_dir, FAST)


def test_writer_alive_sees_the_writer_after_writer_lock_is_unlinked(ledger: Ledger, log_dir: Path) -> None:
    _unlink_lock_files(log_dir)
    assert writer_alive(log_dir)
    ledger.close()
    assert not writer_alive(log_dir)
    Ledger.open(log_dir, FAST).close()  # the lock went with the writer: the log opens again
